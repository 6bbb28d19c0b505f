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

use crate::admission::{Admission, Refusal};
use crate::budget::{Claims, StreamBudget};
use crate::chunker::{Chunk, FlushCause};
use crate::index::StreamIndex;
use crate::mapping::Decision;
use crate::pvp::{Builder, Envelope, Metadata, Participant};
use crate::red::{RedError, RedFormat, RedPayload};
use crate::register::{Arrival, Outcome, Piece, Position, Register};
use crate::rtcp::RtcpEvent;
use crate::rtp::{RtpError, RtpPacket, looks_like_rtcp, ts_after};
use crate::slab::Slab;
use crate::speaker::{
    Bye, CLOCK_RESTART_MS, Output, Speaker, Voice, VoiceRef, clock_jumped, fingerprint, split_named,
};
use crate::stream::{
    Hex8, KeyHasher, Mixer, NO_SPEAKER, SourceText, Speakers, Stream, StreamKey, Unplaced,
    canonical, speaker_index,
};
use crate::t140::{DecodeStats, Decoder};
use crate::time::Time;
use crate::timers::Timers;

/// Senders whose deviations from RFC 4103 need explicit accommodation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compat {
    #[default]
    None,
    /// t140llm 0.0.19 (docs/t140llm.md): 16/8-bit RED headers with blocks newest first, no
    /// marker bit on a session's first packet, FEC on its own payload type, `<id>\x1E`
    /// multiplex prefixes and `MD:` metadata packets.
    T140llm,
}

/// When a packet's CSRC names the speaker (RFC 9071 RTP-mixer multiparty text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MixerMode {
    /// A packet with exactly one CSRC is a mixer's: the CSRC is the speaker.
    #[default]
    Auto,
    /// Any packet with a CSRC: the first CSRC is the speaker.
    On,
    /// CSRCs are ignored: the SSRC is the speaker.
    Off,
}

/// t140llm's FEC payload type (docs/t140llm.md section 8): not RFC 5109, dropped in compat mode.
pub const T140LLM_FEC_PT: u8 = 97;

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
    /// Streams at most: at the limit a new stream takes the place of the oldest that never
    /// carried text (README "Stream limit"), else it is refused and counted. The bound
    /// of one core ([`Gateway::new`]); cores sharing a [`StreamBudget`] share its bound instead,
    /// each guaranteed a part of it.
    pub max_streams: usize,
    pub token: Option<String>,
    /// Seed for the random part of message ULIDs.
    pub id_seed: u128,
    /// How long a packet ahead of a gap waits for the gap to fill (RFC 4103 5.4: up to 1 s).
    pub reorder_wait: Duration,
    pub compat: Compat,
    pub mixer: MixerMode,
    /// Sources allowed to send (empty: any).
    pub allow: Vec<ipnet::IpNet>,
    /// Packets per second one source address:port may send (0: no limit); more are dropped.
    pub max_pps_per_source: u32,
    /// Manual stream mapping (rules, and what to do with unmatched speakers).
    pub mapping: crate::mapping::Mapping,
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
            compat: Compat::None,
            mixer: MixerMode::Auto,
            allow: Vec::new(),
            max_pps_per_source: 1000,
            mapping: Default::default(),
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
    /// t140llm FEC (compat mode): not RFC 5109, and it reuses media sequence numbers.
    T140llmFec,
    /// Compat mode: a T.140 payload (a RED packet's primary) with bytes that are not UTF-8 inside it.
    /// t140llm's text always is, whole characters per packet; its SRTP mode
    /// (`processAIStreamToSrtp`), which the gateway cannot decrypt, looks like this.
    T140llmNotText,
    /// Source outside every `--allow` network.
    NotAllowed,
    /// Source above `--max-pps-per-source`.
    RateLimited,
    /// A datagram of the RTCP port that a receive worker's feed lost: the worker fell more than
    /// the feed's bound behind the port's reader.
    RtcpFeedLagged,
    /// An RTCP compound that names, or says BYE for, more than [`MAX_RTCP_SOURCES`] sources:
    /// the first of them are acted on, the rest not.
    RtcpTooManySources,
}

impl From<Refusal> for DropReason {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::NotAllowed => DropReason::NotAllowed,
            Refusal::RateLimited => DropReason::RateLimited,
        }
    }
}

impl DropReason {
    pub const ALL: [DropReason; 20] = [
        DropReason::Rtp(RtpError::TooShort),
        DropReason::Rtp(RtpError::BadVersion),
        DropReason::Rtp(RtpError::CsrcOverrun),
        DropReason::Rtp(RtpError::ExtensionOverrun),
        DropReason::Rtp(RtpError::BadPadding),
        DropReason::Red(RedError::TruncatedHeader),
        DropReason::Red(RedError::BlockOverrun),
        DropReason::Red(RedError::AmbiguousLength),
        DropReason::RtcpMalformed,
        DropReason::UnknownPayloadType,
        DropReason::Stale,
        DropReason::StreamLimit,
        DropReason::SequenceJump,
        DropReason::SsrcConflict,
        DropReason::T140llmFec,
        DropReason::T140llmNotText,
        DropReason::NotAllowed,
        DropReason::RateLimited,
        DropReason::RtcpFeedLagged,
        DropReason::RtcpTooManySources,
    ];

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
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
            DropReason::T140llmFec => "t140llm_fec",
            DropReason::T140llmNotText => "t140llm_not_text",
            DropReason::NotAllowed => "not_allowed",
            DropReason::RateLimited => "rate_limited",
            DropReason::RtcpFeedLagged => "rtcp_feed_lagged",
            DropReason::RtcpTooManySources => "rtcp_too_many_sources",
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
    /// SDES CNAME or NAME items that are not UTF-8 (RFC 3550 6.5): not taken for a name, but
    /// for one cut inside a character at the item's bound of 255 octets, read up to the cut.
    pub sdes_not_utf8: u64,
    /// SDES names of sources not seen on RTP (kept for their streams' joins) forgotten, the
    /// oldest first, to keep a newer one at their bound of 256.
    pub early_names_forgotten: u64,
    drops: [u64; DropReason::ALL.len()],
    pub streams_total: u64,
    pub streams_live: u64,
    /// Speakers that joined; more than streams when mixers are in use. Speakers a mapping rule
    /// gives one participant id each join here; the sinks let one join a participant out
    /// ([`crate::presence::Presence`], counted in [`crate::metrics::SinkMetrics`]).
    pub speakers_joined: u64,
    /// Speakers that left to make room for a new voice on a stream at its speaker bound.
    pub speakers_recycled: u64,
    /// RTCP datagrams this worker's feeds lost ([`Gateway::rtcp_feed_lost`]): the RTCP port's,
    /// and those other workers handed on ([`Gateway::share_rtcp`]).
    pub rtcp_feed_missed: u64,
    /// Errors this worker's socket returned to a read, other than "nothing to read"
    /// ([`Gateway::socket_errors`]).
    pub socket_errors: u64,
    /// Datagrams the kernel dropped for this worker's socket (its receive buffer full, mostly),
    /// as the shell read them from the kernel ([`Gateway::kernel_drops`]).
    pub kernel_drops: u64,
    /// Streams that never carried text, removed to make room at the stream limit.
    pub evicted: u64,
    /// Chunks of speakers the stream mapping refused (not sent).
    pub refused_chunks: u64,
    chunks: [u64; FlushCause::ALL.len()],
    pub envelopes: u64,
    /// Lost packets recovered from RED generations.
    pub recovered: u64,
    /// Lost packets beyond recovery, marked with U+FFFD (RFC 4103 5.3) where their speaker
    /// is known.
    pub lost: u64,
    /// Of those, marks no speaker could be named for (t140llm multiplexing with several
    /// named streams): counted here, not written into anyone's text.
    pub lost_unattributed: u64,
    /// Packets that arrived ahead of a gap and waited in the reorder buffer.
    pub reordered: u64,
    /// Sequence restarts accepted (RFC 3550 A.1 bad_seq confirmed).
    pub restarts: u64,
    /// Streams whose first packets were lost (first packet without the marker bit).
    pub head_lost: u64,
    /// Lost packets judged to be the redundancy-only tail before an idle period (not marked).
    pub idle_tail: u64,
    /// RED packets whose blocks were newest first (t140llm, or detected; put in age order).
    pub red_newest_first: u64,
    /// RED packets with a block whose payload type is not `--t140-pt` (RFC 4103 4.1: each is
    /// text/t140): read as T.140 all the same, and counted, so a sender's payload types that
    /// disagree with the gateway's flags show.
    pub red_block_pt_other: u64,
    /// t140llm `MD:` metadata packets (compat mode), kept out of the transcript.
    pub metadata: u64,
    /// "[object Object]" taken out of t140llm chunks (compat mode): what t140llm sends for an
    /// LLM SDK chunk it cannot read (`chunk.toString()`), such as OpenAI's last chunk.
    pub t140llm_objects: u64,
    /// t140llm RED packets with a block over 255 bytes, its length clamped, read by the length
    /// of the packet it repeats ([`crate::clamped`]).
    pub red_unclamped: u64,
    /// Sent items corrected (context.update/remove) because backspaces erased their text.
    pub corrections: u64,
    /// Backspaces that reached further back than the last sent item (not applied).
    pub erase_unmatched: u64,
    /// Chunks of nothing but loss marks from speakers that had not joined (not sent): their
    /// first text was lost, or they were junk; the losses are in `lost`.
    pub marks_only_chunks: u64,
    /// T.140 decoder counters of every stream.
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

    /// Adds another gateway's counters (one per receive worker).
    pub fn merge(&mut self, o: &Stats) {
        self.datagrams += o.datagrams;
        self.bytes += o.bytes;
        self.rtcp += o.rtcp;
        self.sdes_not_utf8 += o.sdes_not_utf8;
        for (a, b) in self.drops.iter_mut().zip(o.drops) {
            *a += b;
        }
        self.streams_total += o.streams_total;
        self.streams_live += o.streams_live;
        self.speakers_joined += o.speakers_joined;
        self.speakers_recycled += o.speakers_recycled;
        self.rtcp_feed_missed += o.rtcp_feed_missed;
        self.socket_errors += o.socket_errors;
        self.kernel_drops += o.kernel_drops;
        self.evicted += o.evicted;
        self.refused_chunks += o.refused_chunks;
        for (a, b) in self.chunks.iter_mut().zip(o.chunks) {
            *a += b;
        }
        self.envelopes += o.envelopes;
        self.recovered += o.recovered;
        self.lost += o.lost;
        self.lost_unattributed += o.lost_unattributed;
        self.reordered += o.reordered;
        self.restarts += o.restarts;
        self.head_lost += o.head_lost;
        self.idle_tail += o.idle_tail;
        self.red_newest_first += o.red_newest_first;
        self.red_block_pt_other += o.red_block_pt_other;
        self.early_names_forgotten += o.early_names_forgotten;
        self.metadata += o.metadata;
        self.t140llm_objects += o.t140llm_objects;
        self.red_unclamped += o.red_unclamped;
        self.corrections += o.corrections;
        self.erase_unmatched += o.erase_unmatched;
        self.marks_only_chunks += o.marks_only_chunks;
        self.decode.add(&o.decode);
    }

    /// Moves a stream's register counters into these (zeroing them there), after every call
    /// that may have changed them: so [`Gateway::stats`] is a copy, not a walk over every
    /// stream. They count anomalies, so they are nearly always zero: that is checked first.
    /// (Speakers count straight into the gateway's [`Output`].)
    fn harvest(&mut self, register: &mut Register) {
        if let Some(r) = register.take_stats() {
            self.recovered += r.recovered;
            self.lost += r.lost;
            self.reordered += r.reordered;
            self.restarts += r.restarts;
            self.drops[DropReason::SequenceJump.index()] += r.jumps;
            self.drops[DropReason::Stale.index()] += r.stale_kept;
            self.head_lost += r.head_lost;
            self.idle_tail += r.idle_tail;
        }
    }
}

/// What the gateway sends: the PVP builder, the output queue and the counters, kept apart from
/// the stream table so a stream can be borrowed while its speakers emit.
struct Emitter {
    pvp: Builder,
    out: VecDeque<Envelope>,
    stats: Stats,
    /// Chunks a speaker's text cut, taken before the next speaker is fed, and its counters.
    said: Output,
    roles: Vec<String>,
    mapping: crate::mapping::Mapping,
    /// `--compat t140llm`: "[object Object]" is taken out of chunks ([`T140LLM_OBJECT`]).
    t140llm: bool,
}

/// What t140llm 0.0.19 sends for an LLM SDK chunk whose shape it does not know
/// (`extractTextFromChunk` falls back to `chunk.toString()`): OpenAI's last chunk of a streamed
/// reply, Anthropic's `message_start`, `content_block_start`, `content_block_stop`,
/// `message_delta`, `message_stop`, `ping`. Never text of the reply (docs/t140llm.md, section 2).
const T140LLM_OBJECT: &str = "[object Object]";

/// The quiet before a t140llm reply's packet 1 or 2 from a new port, its packet 0 lost: the
/// last reply's transport ended (its socket closed), and the new one's pacer sends a packet
/// each 100 ms tick (docs/t140llm.md section 4), the first a tick after it was made, so its
/// packet 1 comes at least two ticks after the last reply's last packet. A transport still
/// sending sent less than a tick ago.
const T140LLM_REPLY_GAP: Duration = Duration::from_millis(150);

impl Emitter {
    fn push(&mut self, e: Envelope) {
        self.stats.envelopes += 1;
        self.out.push_back(e);
    }

    fn participant(&self, key: &StreamKey, sp: &Speaker) -> Participant {
        // Keys in ascending order (`Metadata::field`).
        let mut metadata = Metadata::default();
        if let Voice::Csrc(c) = &sp.voice {
            metadata = metadata.field("csrc", Hex8::new(*c));
        }
        metadata = metadata
            .field("gateway", concat!("pvp-t140/", env!("CARGO_PKG_VERSION")))
            .field("source", SourceText(&key.source))
            .field("ssrc", Hex8::new(key.ssrc));
        if let Voice::Named(id) = &sp.voice {
            metadata = metadata.field("stream_id", id);
        }
        Participant {
            id: sp.profile.participant.to_string(),
            // A name with nothing left to show is not sent as it came: the voice's own name
            // takes its place, as for a nameless speaker, or the stream's (a t140llm stream id
            // of spaces is its voice's name).
            name: clean_name(&sp.profile.name)
                .or_else(|| clean_name(&sp.voice.display_name(key)))
                .unwrap_or_else(|| key.display_name()),
            roles: sp
                .profile
                .roles
                .clone()
                .unwrap_or_else(|| self.roles.clone()),
            metadata,
        }
    }

    /// Builds an envelope in the speaker's session (a mapping rule may name another one).
    fn in_session<R>(&mut self, sp: &Speaker, f: impl FnOnce(&mut Builder) -> R) -> R {
        let Some(session) = &sp.profile.session else {
            return f(&mut self.pvp);
        };
        let home = std::mem::replace(&mut self.pvp.session, session.clone());
        let r = f(&mut self.pvp);
        self.pvp.session = home;
        r
    }

    /// pvp-spec 6.3: a participant joins before anything else it sends. The stream mapping
    /// decides here, once, who the speaker is (its SDES name may be known by now): a mixer's
    /// source joining again after its BYE keeps what its rule made it. Returns false for a
    /// speaker the mapping refused.
    fn ensure_joined(&mut self, now: Time, key: &StreamKey, sp: &mut Speaker) -> bool {
        if sp.joined || sp.refused {
            return sp.joined;
        }
        let own = match sp.voice {
            Voice::Csrc(c) => c,
            _ => key.ssrc,
        };
        let rtcp_name = (sp.profile.name_rank > 0).then_some(sp.profile.name.as_str());
        let decision = if sp.profile.mapped {
            Decision::Auto
        } else {
            sp.profile.mapped = true;
            self.mapping.decide(own, key.source.ip(), rtcp_name)
        };
        match decision {
            Decision::Refuse => {
                sp.refused = true;
                tracing::info!(participant = %sp.profile.participant, "no stream mapping rule matches; refused");
                return false;
            }
            Decision::Rule(rule) => {
                let rule = rule.clone();
                if let Some(id) = rule.participant {
                    // Other speakers may match the same rule: their keys stay apart, by the
                    // speaker's own id (kept from its first join: a rejoin after a BYE finds
                    // the rule's id in its place).
                    if sp.profile.key_scope.is_none() {
                        sp.profile.key_scope = Some((*sp.profile.participant).into());
                    }
                    sp.profile.participant = id.into();
                }
                if let Some(name) = rule.name {
                    sp.profile.name = name;
                    sp.profile.name_rank = u8::MAX;
                }
                sp.profile.roles = rule.roles;
                sp.profile.session = rule.session.as_deref().map(crate::pvp::SessionText::new);
            }
            Decision::Auto => {}
        }
        sp.joined = true;
        let p = self.participant(key, sp);
        tracing::info!(participant = %p.id, name = %p.name, "participant joins");
        let e = self.in_session(sp, |b| b.join(now, sp.profile.participant.clone(), &p));
        self.stats.speakers_joined += 1;
        self.push(e);
        true
    }

    /// A speaker's end (its stream's, or its own BYE in a mixer's): what it said and has not
    /// been sent goes out, then its leave.
    fn speaker_ends(
        &mut self,
        now: Time,
        key: &StreamKey,
        created: &Time,
        sp: &mut Speaker,
        reason: &str,
    ) {
        let said = &mut self.said;
        sp.decoder
            .finish(&mut sp.chunker.fed(&mut said.cuts), &mut said.decode);
        self.after_text(now, key, created, sp);
        if let Some(chunk) = sp.chunker.flush(FlushCause::End) {
            self.chunk(now, key, created, sp, chunk);
        }
        if sp.joined {
            let leave =
                self.in_session(sp, |b| b.leave(now, sp.profile.participant.clone(), reason));
            self.push(leave);
        }
        // A mixer's source keeps its speaker past its BYE (RFC 3550 6.6), and what it says
        // next is a new participation (it joins again): a backspace in it must not reach this
        // one's last item, nor the white space typed after it.
        sp.profile.last_sent = 0;
        sp.profile.last_sent_text.clear();
        sp.chunker.forget_typed();
    }

    /// An SDES name (`rank` 2 for NAME, 1 for CNAME: a NAME is never replaced by a CNAME) for
    /// a speaker. The join already went out with the old name: the new one is announced
    /// (pvp-spec 7.1).
    /// `name` as [`sdes_item`] gives it.
    fn rename(&mut self, now: Time, key: &StreamKey, sp: &mut Speaker, name: &str, rank: u8) {
        if rank < sp.profile.name_rank {
            return;
        }
        // Said again (every compound carries the CNAME, RFC 3550 6.1, every few seconds from
        // each of thousands of streams): nothing to keep or announce, and nothing allocated
        // (review ah). A name shown the same is kept, not announced: a NAME equal to the CNAME
        // is a NAME all the same, and rules match the item as it came.
        if rank != sp.profile.name_rank || sp.profile.name != name {
            let shown_anew = clean_name(&sp.profile.name) != clean_name(name);
            sp.profile.name = name.to_owned();
            sp.profile.name_rank = rank;
            self.map_again(key, sp);
            if shown_anew {
                self.announce(now, key, sp);
            }
            return;
        }
        self.map_again(key, sp);
    }

    /// A speaker the mapping refused before its SDES name came (its first sentence is cut at
    /// once, the sender's first RTCP report 1-3 s later, RFC 3550 6.3.1) is taken once a rule
    /// matches it by the name: it joins with its next chunk, as that rule makes it. What it
    /// said before stays refused (counted).
    fn map_again(&mut self, key: &StreamKey, sp: &mut Speaker) {
        if !sp.refused || sp.profile.name_rank == 0 {
            return;
        }
        let own = match sp.voice {
            Voice::Csrc(c) => c,
            _ => key.ssrc,
        };
        let name = Some(sp.profile.name.as_str());
        if let Decision::Rule(_) = self.mapping.decide(own, key.source.ip(), name) {
            sp.refused = false;
            sp.profile.mapped = false;
        }
    }

    /// A new name for a participant that already joined (one that has not carries it in its join).
    fn announce(&mut self, now: Time, key: &StreamKey, sp: &Speaker) {
        if !sp.joined {
            return;
        }
        let p = self.participant(key, sp);
        let e = self.in_session(sp, |b| b.announce(now, sp.profile.participant.clone(), &p));
        self.push(e);
    }

    /// What a speaker holds, cut as an idle flush at `at`; nothing for a blank buffer, which
    /// [`crate::chunker::Chunker::flush`] would still count as white space typed.
    #[inline]
    fn idle_flush(&mut self, at: Time, key: &StreamKey, created: &Time, sp: &mut Speaker) {
        if !sp.chunker.is_blank()
            && let Some(chunk) = sp.chunker.flush(FlushCause::Idle)
        {
            self.chunk(at, key, created, sp, chunk);
        }
    }

    /// After text reached a speaker's chunker: first correct sent text that backspaces erased
    /// (they came before any chunk cut since), then send the chunks cut.
    #[inline]
    fn after_text(&mut self, now: Time, key: &StreamKey, created: &Time, sp: &mut Speaker) {
        if sp.chunker.erase_pending() || !self.said.cuts.is_empty() {
            self.send_text(now, key, created, sp);
        }
    }

    /// Out of line: `key` and `created` sit in the stream's cold tail, and a reference the
    /// compiler sees dereferenced may be loaded ahead of the test that guards it, a cache
    /// miss on every packet (callgrind, 10,000 streams) for what one packet in twenty needs.
    #[inline(never)]
    fn send_text(&mut self, now: Time, key: &StreamKey, created: &Time, sp: &mut Speaker) {
        let erase = sp.chunker.take_erase_sent();
        if erase > 0 {
            self.erase_sent(now, *created, sp, erase);
        }
        while let Some(chunk) = self.said.cuts.pop() {
            self.chunk(now, key, created, sp, chunk);
        }
    }

    /// T.140 backspace reaching text already sent: a transcript must not keep characters the
    /// speaker erased, so the last item is replaced (pvp-spec 9.3 `context.update`), or removed
    /// when nothing is left. Erasing further back than the last item is counted, not applied.
    /// The stored text keeps the white space the erasing exposes, since each later backspace
    /// erases one of those spaces first; only the item sent is trimmed, and erasing nothing but
    /// such spaces changes no item.
    fn erase_sent(&mut self, now: Time, created: Time, sp: &mut Speaker, count: usize) {
        if sp.profile.last_sent == 0 {
            self.stats.erase_unmatched += count as u64;
            return;
        }
        let text = &mut sp.profile.last_sent_text;
        let shown_before = text.trim_end().len();
        let mut erased = 0;
        while erased < count && !text.is_empty() {
            // A backspace erases what it erases in the buffer ([`crate::chunker::Cuts::erase_clusters`]).
            if self.said.cuts.erases_clusters() {
                crate::chunker::pop_cluster(text);
            } else {
                text.pop();
            }
            erased += 1;
        }
        self.stats.erase_unmatched += (count - erased) as u64;
        let shown = text.trim_end().len();
        if shown == shown_before {
            return;
        }
        let key = sp.key(created, sp.profile.last_sent);
        let reason = "T.140 backspace erased transcribed text";
        // Nothing left that shows (a word joiner the item began with): removed, as an item
        // of it alone is never added.
        let e = if crate::chunker::all_blank(&sp.profile.last_sent_text[..shown]) {
            sp.profile.last_sent = 0;
            self.in_session(sp, |b| {
                b.context_remove(now, sp.profile.participant.clone(), &key, reason)
            })
        } else {
            let text = &sp.profile.last_sent_text[..shown];
            self.in_session(sp, |b| {
                b.context_update(now, sp.profile.participant.clone(), &key, text, reason)
            })
        };
        self.stats.corrections += 1;
        self.push(e);
    }

    /// `key` and `created` are borrowed, not copied: they sit in the stream's cold tail and are
    /// read only for a speaker's first chunk (its join and `context.add` template); copied at
    /// the call, they were a cache miss on every flush (callgrind, 10,000 streams).
    fn chunk(
        &mut self,
        now: Time,
        key: &StreamKey,
        created: &Time,
        sp: &mut Speaker,
        mut chunk: Chunk,
    ) {
        if self.t140llm && chunk.text.contains(T140LLM_OBJECT) {
            self.stats.t140llm_objects += chunk.text.matches(T140LLM_OBJECT).count() as u64;
            let text = chunk.text.replace(T140LLM_OBJECT, "");
            let text = text.trim();
            // What is left may show nothing (a zero-width space after the object): such a
            // chunk is never sent (`Chunker::flush`).
            if crate::chunker::all_blank(text) {
                sp.chunker.recycle(chunk.text);
                return;
            }
            chunk.text = text.to_owned();
        }
        if !sp.joined && marks_only(&chunk.text) {
            // Loss marks and nothing else from a speaker that has said nothing yet (its first
            // text lost, or a junk SSRC's unmarked empty packet taken for a lost start): no
            // transcript to mark, and no participant should join only to say U+FFFD.
            self.stats.marks_only_chunks += 1;
            sp.chunker.recycle(chunk.text);
            return;
        }
        if !self.ensure_joined(now, key, sp) {
            self.stats.refused_chunks += 1;
            return;
        }
        sp.profile.chunks_sent += 1;
        sp.profile.last_sent = sp.profile.chunks_sent;
        let cause = chunk.cause;
        sp.ensure_template(key, created);
        let (sender, n) = (&sp.profile.participant, sp.profile.chunks_sent);
        let e = self.in_session(sp, |b| b.context_add(now, sender, n, &chunk.text, cause));
        self.stats.chunks[chunk.cause as usize] += 1;
        if let Some(e) = e {
            self.push(e);
        }
        // Kept for corrections (a backspace past the buffer): moved, not copied. The text it
        // replaces becomes the chunker's next buffer (the chunk took the last one): no `free`
        // of a cold block here, no `malloc` at the next text.
        let old = std::mem::replace(&mut sp.profile.last_sent_text, chunk.text);
        sp.chunker.recycle(old);
    }
}

/// What [`route`] needs of one stream: its speakers, what a new speaker or a flush reads (the
/// key and creation time, from the stream's cold tail, by reference), and how its payloads are
/// read.
struct Voices<'a> {
    speakers: &'a mut crate::stream::Speakers,
    own: &'a mut u8,
    mixer: &'a mut crate::stream::Mixer,
    unplaced_at: &'a mut crate::stream::Unplaced,
    key: &'a StreamKey,
    created: &'a Time,
    format: RedFormat,
    compat: Compat,
}

impl<'a> Voices<'a> {
    /// Splits `stream` into its register and the voices the register's pieces go to.
    #[inline(always)]
    fn of(stream: &'a mut Stream, compat: Compat) -> (&'a mut Register, Self) {
        let Stream {
            register,
            speakers,
            own,
            mixer,
            unplaced_at,
            key,
            created,
            format,
            ..
        } = stream;
        let voices = Voices {
            speakers,
            own,
            mixer,
            unplaced_at,
            key,
            created,
            format: *format,
            compat,
        };
        (register, voices)
    }

    /// The index of `voice` among the speakers, creating it on first use ([`speaker_index`]).
    #[inline(always)]
    fn speaker(&mut self, voice: VoiceRef<'_>, now: Time) -> usize {
        speaker_index(self.speakers, self.own, self.key, voice, now)
    }
}

/// Hands one register piece to the speaker it belongs to (creating and announcing speakers on
/// first use), then sends what that completed. Every in-order packet passes here: inlined, it
/// costs what a copy of it at the call site would (callgrind: 28 instructions a packet less
/// than the call).
#[inline(always)]
fn route(emit: &mut Emitter, v: &mut Voices<'_>, now: Time, tag: u16, piece: Piece<'_>) {
    if let Piece::Restart = piece {
        return restarted(v.speakers, &mut emit.said.decode);
    }
    let mut piece = piece;
    let voice = match piece {
        // t140llm multiplexing names the stream in front of every block.
        Piece::Text(block) if v.compat == Compat::T140llm => match split_named(block) {
            Some((id, text)) => {
                piece = Piece::Text(text);
                Some(id)
            }
            None => None,
        },
        _ => None,
    };
    let idx = match voice {
        Some(id) => {
            if v.speakers.len() >= crate::stream::MAX_SPEAKERS {
                // A name is resolved at delivery: no held packet stands for a named speaker.
                let at = Place {
                    key: v.key,
                    created: v.created,
                };
                let voice = VoiceRef::Named(id);
                let room = make_room(emit, None, v.speakers, *v.own, at, now, voice, &|_| false);
                v.mixer.spoke |= room.is_some_and(|(_, joined)| joined);
            }
            v.speaker(VoiceRef::Named(id), now)
        }
        None if usize::from(tag) < v.speakers.len() => usize::from(tag),
        // Undecided at arrival (t140llm) and not named: the stream's own voice, but a loss
        // only if that is certain, and an empty block (the idle period's, a t140llm `MD:`
        // packet's remains) names no one, so it does not make the own voice a speaker.
        None => match piece {
            Piece::Lost => match lost_speaker(v) {
                Some(idx) => idx,
                None => {
                    emit.stats.lost_unattributed += 1;
                    return;
                }
            },
            Piece::Text([]) if *v.own == crate::stream::NO_SPEAKER => return,
            _ => v.speaker(VoiceRef::Ssrc, now),
        },
    };
    // A mixer's packet placed by timestamp also accounts for the stream's earlier unplaced
    // losses (constant-folded away where `piece` is known to be text).
    let placed = matches!(piece, Piece::Packet { .. });
    // This packet's own gap's losses, when no older ones wait: they lie after what the stream
    // delivered so far.
    let mut after = None;
    if let Piece::Packet { gap, red, ts, .. } = &mut piece {
        if v.mixer.unplaced > 0 {
            emit.stats.idle_tail += unplaced_expire(v, *ts);
        }
        if v.mixer.unplaced == 0 && *gap > 0 {
            after = Some(newest_delivered(v.speakers));
        }
        *gap = gap.saturating_add(usize::from(v.mixer.unplaced));
        if *gap > 0 && !*red && v.compat == Compat::T140llm && v.speakers.len() > 1 {
            // t140llm's CSRC multiplexing: one sequence for every named stream, and no
            // redundancy to tell whose packets the gap lost. As with its named streams
            // (`lost_speaker`), a loss goes only to a stream's only voice, else it is counted.
            emit.stats.lost += *gap as u64;
            emit.stats.lost_unattributed += *gap as u64;
            *gap = 0;
        }
    }
    if let Piece::Packet { ts, at, .. } = piece
        && ((v.speakers[idx].last_ts)
            .or_else(|| waiting_bye_ts(&v.speakers[idx]))
            .is_some_and(|l| ts_after(l, ts.wrapping_add(CLOCK_RESTART_MS)))
            || clock_stepped_ahead(&mut v.speakers.as_mut_slice()[idx], ts, at))
    {
        speaker_clock_restarted(emit, v, now, idx, ts);
    }
    let sp = &mut v.speakers.as_mut_slice()[idx];
    // The chunks cut are one speaker's: the last speaker's were all taken.
    debug_assert!(emit.said.cuts.is_empty());
    // A mixer's packet: a speaker whose BYE waited for the packets held when it came may
    // leave now (constant-folded away where `piece` is known to be text).
    let bye_ts = match piece {
        Piece::Packet { ts, .. } if v.mixer.byes > 0 => Some(ts),
        _ => None,
    };
    if bye_ts.is_some()
        && let Some(b) = sp.profile.bye_at()
        && said_after(&piece, v.format, b.ts)
    {
        // Said after its BYE: the leave comes first, and this joins it again (RFC 3550
        // 6.3.7).
        mixer_source_leaves(emit, v, now, idx);
        if let Some(ts) = bye_ts {
            drop_repeated_bye(v, idx, ts);
        }
    }
    if placed {
        // The losses this packet may account for lie after what the stream delivered before
        // the oldest of them (their packets came before those after the gap).
        emit.said.floor = match v.speakers[idx].last_ts {
            None if v.mixer.unplaced > 0 => v.unplaced_at.after,
            None => newest_delivered(v.speakers),
            Some(_) => None,
        };
        emit.said.older = match v.speakers[idx].last_ts {
            Some(l) if v.mixer.unplaced > 0 && !ts_after(v.unplaced_at.until, l) => {
                usize::from(v.mixer.unplaced)
            }
            _ => 0,
        };
    }
    let sp = &mut v.speakers.as_mut_slice()[idx];
    sp.feed(now, piece, v.format, &mut emit.said);
    if let Piece::Packet { ts, .. } = piece {
        if let Some(after) = after.filter(|_| emit.said.unplaced > 0) {
            *v.unplaced_at = crate::stream::Unplaced { after, until: ts };
        } else if emit.said.unplaced > 0 {
            v.unplaced_at.until = ts;
        }
        v.mixer.unplaced = u16::try_from(emit.said.unplaced).unwrap_or(u16::MAX);
    }
    emit.after_text(now, v.key, v.created, sp);
    if let Some(ts) = bye_ts {
        // The stream delivered up to `ts` (a mixer's timestamps are one clock for all its
        // sources, RFC 9071 section 4).
        byes_due(emit, v, now, |b| !ts_after(b.ts, ts));
    }
}

/// The furthest back a redundant block reaches: its timestamp offset has 14 bits (RFC 2198
/// section 3).
const RED_REACH_MS: u32 = 0x3fff;

/// A mixer's unplaced losses that no packet stamped `ts` or later can account for, its
/// generations reaching back at most [`RED_REACH_MS`], are let go: a source that went quiet
/// after them lost its idle tail (RFC 4103 5.2), nothing to mark, and another speaker's loss
/// much later is not theirs (README "Loss"). So are those a clock that stepped back or
/// restarted (as far behind them) left on the old clock.
#[cold]
#[inline(never)]
fn unplaced_expire(v: &mut Voices<'_>, ts: u32) -> u64 {
    let d = ts.wrapping_sub(v.unplaced_at.until);
    if d.min(d.wrapping_neg()) > RED_REACH_MS {
        return v.mixer.let_go_unplaced();
    }
    0
}

/// Whether the mixer's clock stepped (or restarted) ahead since the speaker's last packet: this
/// one, stamped `ts` and come at `at`, runs more than [`CLOCK_RESTART_MS`] further ahead of our
/// clock than the speaker's packets did ([`crate::speaker::Lead`]). Its timestamp alone cannot
/// tell: a speaker silent that long stamps as far ahead of its last packet. Stamped back from
/// the new clock, its redundancy (its delivered packets) would look new.
/// Not after the mixer restarted its sequence: its new clock is the new session's, and the
/// restart's first packet's redundancy is its lost first packets' ([`Piece::Restart`]).
#[inline(never)]
fn clock_stepped_ahead(sp: &mut Speaker, ts: u32, at: Time) -> bool {
    let Some(m) = sp.profile.mixer.as_deref_mut() else {
        return false;
    };
    let this = ts.wrapping_sub(at.as_millis() as u32);
    !std::mem::take(&mut m.restarted)
        && (m.lead).is_some_and(|l| ts_after(this, l.most().wrapping_add(CLOCK_RESTART_MS)))
}

/// The sender restarted its sequence ([`Piece::Restart`]): a mixer's speakers' next packets
/// are on the new session's clock, and no speaker's decoder reads the new session's text as
/// the rest of a control function the old one left unfinished (its end lost: an OSC string
/// swallowed up to 256 characters of the new session).
#[cold]
#[inline(never)]
fn restarted(speakers: &mut crate::stream::Speakers, counts: &mut crate::t140::DecodeStats) {
    for sp in speakers.iter_mut() {
        if let Some(m) = sp.profile.mixer.as_deref_mut() {
            m.restarted = true;
        }
        sp.decoder.end_control(counts);
    }
}

/// When the BYE of a speaker that has placed no packet yet was sent, if it waits: a speaker a
/// BYE named before any of its packets came ([`Gateway::unheard_source`]) has that moment to
/// tell its first packet's clock by (a mixer that restarted since stamps far behind it).
#[cold]
#[inline(never)]
fn waiting_bye_ts(sp: &Speaker) -> Option<u32> {
    sp.profile.bye_at().map(|b| b.ts)
}

/// Whether a mixer's packet says anything after its source's BYE, sent at `bye` on the
/// mixer's clock: a block with text stamped after it (RFC 4103 4.2: a redundant block is
/// stamped back by its offset; one at offset 0 counts as the packet's own stamp). An idle
/// tail (RFC 4103 5.2: an empty primary) stamped after the BYE that carries the source's last
/// words as redundancy says nothing new: those words are the old participation's.
#[cold]
#[inline(never)]
fn said_after(piece: &Piece<'_>, format: RedFormat, bye: u32) -> bool {
    let Piece::Packet {
        ts, red, payload, ..
    } = *piece
    else {
        return false;
    };
    if !red {
        return !payload.is_empty() && ts_after(ts, bye);
    }
    let Ok(p) = RedPayload::parse_as(payload, format) else {
        return ts_after(ts, bye);
    };
    let gens = p.redundant_blocks().map(|b| (b.ts_offset, b.data));
    (gens.chain([(0, p.primary().data)]))
        .any(|(back, data)| !data.is_empty() && ts_after(ts.wrapping_sub(u32::from(back)), bye))
}

/// The mixer's RTP clock (RFC 4103 3: 1000 Hz) when a BYE arriving at `now` was sent, at
/// most: `now` plus how far the mixer's clock ran ahead of ours ([`crate::speaker::Lead`]: the
/// newest packet held, and each speaker's quickest packet of the last 30-60 s), the most of
/// those whose packets came within [`LEAD_FRESH_MS`] of the latest and on the latest's clock
/// (not one it restarted from), plus [`BYE_CLOCK_SLACK_MS`]. None if no packet of the stream
/// was placed by a speaker.
#[cold]
#[inline(never)]
fn bye_sent_by(register: &Register, speakers: &crate::stream::Speakers, now: Time) -> Option<u32> {
    let ms = |t: Time| t.as_millis() as u32;
    let held = (register.newest_held()).map(|(ts, at)| (ts.wrapping_sub(ms(at)), at));
    let leads = (speakers.iter())
        .filter_map(|sp| sp.profile.mixer.as_ref()?.lead)
        .map(|l| (l.most(), l.at));
    let all = || held.into_iter().chain(leads.clone());
    let (latest, at) = all().max_by_key(|&(_, at)| at)?;
    let since = Time::from_millis(at.as_millis().saturating_sub(LEAD_FRESH_MS));
    (all().filter(|&(lead, at)| at >= since && !clock_jumped(lead, latest)))
        .map(|(lead, _)| lead)
        .reduce(|a, b| if ts_after(b, a) { b } else { a })
        .map(|lead| ms(now).wrapping_add(lead).wrapping_add(BYE_CLOCK_SLACK_MS))
}

/// How long a speaker's last packet speaks for the mixer's clock ([`bye_sent_by`]).
const LEAD_FRESH_MS: u64 = 60_000;

/// How much quicker than the stream's quickest packet a BYE may have come (its own socket,
/// read apart). A packet stamped within this after the BYE was sent is still taken as sent
/// before it: one participation, where a wrong split would make a second. A source that
/// speaks again after its BYE buffers its new text first (RFC 4103 5.1: 300 ms), so its packet
/// is stamped well beyond this.
const BYE_CLOCK_SLACK_MS: u32 = 20;

/// When the first of a mixer's sources whose leave waits ([`Bye::by`]) leaves: at its wait's
/// end, unless a packet it may have sent before its BYE is still held then (its gap's wait
/// from the packet's arrival outlasts the BYE's); such a leave follows that packet's delivery,
/// which the register's deadline covers.
#[cold]
#[inline(never)]
fn first_bye_end(register: &Register, speakers: &crate::stream::Speakers) -> Time {
    (speakers.iter())
        .filter_map(|sp| sp.profile.bye_at())
        .filter(|b| !register.holds_up_to(b.ts))
        .map(|b| b.by)
        .min()
        .unwrap_or(Time::NEVER)
}

/// A mixer's packet stamped `ts` for speaker `idx`, far behind the speaker's newest
/// ([`CLOCK_RESTART_MS`]): the mixer's clock restarted (a restart the register accepted) or
/// stepped back; or far ahead of our clock for its speaker ([`clock_stepped_ahead`]): it
/// stepped forward. The speaker's place moves back to just before it, so that this packet's text
/// is new and its redundancy (the speaker's earlier packets, delivered) is not said again; a
/// BYE of the speaker that waits was on the old clock, so its leave comes now, before this.
/// Only this speaker: the others move back when their own packets come (one that is new, or
/// that has not spoken since, has nothing to move).
#[cold]
#[inline(never)]
fn speaker_clock_restarted(emit: &mut Emitter, v: &mut Voices<'_>, now: Time, idx: usize, ts: u32) {
    if v.speakers[idx].profile.bye_at().is_some() {
        mixer_source_leaves(emit, v, now, idx);
        // A second BYE waiting was on the old clock too.
        forget_byes(&mut v.speakers.as_mut_slice()[idx], v.mixer);
    }
    v.speakers.as_mut_slice()[idx].last_ts = Some(ts.wrapping_sub(1));
}

/// The newest timestamp a mixer's stream delivered, over its speakers (one clock).
#[cold]
#[inline(never)]
fn newest_delivered(speakers: &crate::stream::Speakers) -> Option<u32> {
    speakers
        .iter()
        .filter_map(|sp| sp.last_ts)
        .reduce(|a, b| if ts_after(b, a) { b } else { a })
}

/// The speakers whose leave waits after their BYE ([`crate::speaker::MixerVoice::bye_at`])
/// leave where `due` says nothing sent before the BYE can still come.
#[cold]
#[inline(never)]
fn byes_due(emit: &mut Emitter, v: &mut Voices<'_>, now: Time, due: impl Fn(&Bye) -> bool) {
    for idx in 0..v.speakers.len() {
        if v.speakers[idx].profile.bye_at().as_ref().is_some_and(&due) {
            mixer_source_leaves(emit, v, now, idx);
        }
    }
}

/// A mixer's source whose BYE waited ([`crate::speaker::MixerVoice::bye_at`]) leaves: its
/// text so far goes out, then its leave. A second BYE that came meanwhile
/// ([`crate::speaker::MixerVoice::bye_then`]) waits next.
#[cold]
#[inline(never)]
fn mixer_source_leaves(emit: &mut Emitter, v: &mut Voices<'_>, now: Time, idx: usize) {
    let sp = &mut v.speakers.as_mut_slice()[idx];
    let m = sp.profile.mixer();
    m.bye_at = m.bye_then.take();
    if m.bye_at.is_none() {
        v.mixer.byes = v.mixer.byes.saturating_sub(1);
    }
    emit.speaker_ends(now, v.key, v.created, sp, "rtcp bye");
    v.mixer.spoke |= sp.joined;
    sp.joined = false;
}

/// After a mixer's source left and spoke again with a packet stamped `ts`: a BYE of it that
/// waits still but was sent before `ts` (the BYE repeated, as a mixer may forward it more than
/// once) ends nothing it says now, and goes.
#[cold]
#[inline(never)]
fn drop_repeated_bye(v: &mut Voices<'_>, idx: usize, ts: u32) {
    let sp = &mut v.speakers.as_mut_slice()[idx];
    if sp.profile.bye_at().is_some_and(|b| ts_after(ts, b.ts)) {
        forget_byes(sp, v.mixer);
    }
}

/// A mixer's source's waiting BYEs ([`crate::speaker::MixerVoice::bye_at`], `bye_then`) are
/// let go without a leave, and the stream's count of waiting leaves follows.
fn forget_byes(sp: &mut Speaker, mixer: &mut crate::stream::Mixer) {
    if let Some(m) = sp.profile.mixer.as_deref_mut()
        && m.bye_at.take().is_some()
    {
        m.bye_then = None;
        mixer.byes = mixer.byes.saturating_sub(1);
    }
}

/// Whose text a packet lost beyond recovery was, when its stream names its speakers in the
/// text (t140llm multiplexing: one SSRC and one sequence for many named streams, each block
/// prefixed with its name). The name went with the packet, so the mark goes where it cannot be
/// wrong: to the stream's one voice, named or not, if it has only one that spoke. Otherwise
/// (several, or none yet) it is nobody's for certain, and marking it on the SSRC's voice would
/// make a participant no one speaks as (joining only to say U+FFFD): the caller counts it
/// instead ([`Stats::lost_unattributed`]).
#[cold]
#[inline(never)]
fn lost_speaker(v: &Voices<'_>) -> Option<usize> {
    (v.speakers.len() == 1).then_some(0)
}

/// Names a new speaker (source `id`: the stream's SSRC, or a mixer's CSRC) by the SDES that
/// came for it before its first packet (kept in `early`, by address and source), so that its
/// join carries the name and `rtcp_name` rules can match it.
#[cold]
#[inline(never)]
fn name_new_speaker(early: &mut Vec<EarlyName>, key: &StreamKey, id: u32, sp: &mut Speaker) {
    if let Some(e) = take_early_name(early, key.source.ip(), id) {
        e.name(sp);
    }
}

/// Keeps an SDES name for a source not seen on RTP ([`Gateway::early_names`]); a NAME is never
/// replaced by a CNAME. A name replaced keeps its mixer ([`EarlyName`]): the source's session
/// is still the evicted mixer's until its BYE. At [`MAX_EARLY_NAMES`] the oldest is forgotten
/// and counted in `forgotten` ([`Stats::early_names_forgotten`]).
fn keep_name(early: &mut Vec<EarlyName>, mut new: EarlyName, forgotten: &mut u64) {
    if let Some(i) = early.iter().position(|e| e.of(new.ip, new.id)) {
        if early[i].rank > new.rank {
            return;
        }
        new.via = new.via.or(early.remove(i).via);
    }
    if early.len() >= MAX_EARLY_NAMES {
        early.remove(0);
        *forgotten += 1;
    }
    early.push(new);
}

/// The early name of source `id` of host `ip`, taken out of `early`.
fn take_early_name(early: &mut Vec<EarlyName>, ip: IpAddr, id: u32) -> Option<EarlyName> {
    let i = early.iter().position(|e| e.of(ip, id))?;
    Some(early.remove(i))
}

/// The SSRC an RTCP event is about.
fn rtcp_ssrc(e: &RtcpEvent<'_>) -> u32 {
    let (RtcpEvent::Cname { ssrc, .. }
    | RtcpEvent::Name { ssrc, .. }
    | RtcpEvent::Bye { ssrc }
    | RtcpEvent::Report { ssrc }
    | RtcpEvent::NotUtf8 { ssrc }) = *e;
    ssrc
}

/// Whether RTCP about `ssrc` from `source` is for stream `k`: from its address (rtcp-mux,
/// RFC 5761) or the port above its RTP's (RFC 3550 11), as [`Gateway::rtcp_stream`] finds it.
fn rtcp_from(k: &StreamKey, source: SocketAddr, ssrc: u32) -> bool {
    let port = k.source.port();
    k.ssrc == ssrc
        && k.source.ip() == source.ip()
        && (port == source.port() || port == source.port().wrapping_sub(1))
}

/// Where a stream's speakers speak: what a speaker's first chunk or its end reads.
#[derive(Clone, Copy)]
struct Place<'a> {
    key: &'a StreamKey,
    created: &'a Time,
}

/// A voice not heard yet on a stream whose speakers are at [`crate::stream::MAX_SPEAKERS`]:
/// the longest silent of them that holds nothing (not the stream's own voice; no text buffered,
/// nor part of a character, nor an escape sequence begun, whose rest would be its next text;
/// nor a correction; no BYE it waits on; no packet the register holds for it, `held`) ends,
/// its leave sent, and its place is the new voice's, which joins at its first text. Without
/// one, the stream's own voice speaks for the new one ([`crate::stream::speaker_index`]).
/// t140llm's multiplexer names every reply's stream anew (a new CSRC in its CSRC mode), so a
/// long-lived one passes the bound. Returns the place made, and whether the speaker that left
/// it had joined ([`crate::stream::Mixer::spoke`]). A mixer's source that leaves keeps its
/// SDES name (not a rule's) in `names` ([`EarlyName`], the mixer's to forget at its BYE): the
/// mixer may send it only now and then (RFC 3550 6.5 lets a mixer spread its sources' SDES
/// over its reports), and the source, back, would join nameless, or be refused by the
/// `rtcp_name` rule that took it (review ab).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn make_room(
    emit: &mut Emitter,
    names: Option<&mut Vec<EarlyName>>,
    speakers: &mut crate::stream::Speakers,
    own: u8,
    at: Place<'_>,
    now: Time,
    voice: VoiceRef<'_>,
    held: &dyn Fn(usize) -> bool,
) -> Option<(usize, bool)> {
    if speakers.iter().any(|s| s.voice.as_ref() == voice) {
        return None;
    }
    let quiet = |(i, sp): &(usize, &Speaker)| {
        *i != usize::from(own)
            && sp.chunker.is_blank()
            && !sp.chunker.erase_pending()
            && !sp.decoder.holds_partial()
            && !sp.decoder.in_control()
            && sp.profile.bye_at().is_none()
            && !held(*i)
    };
    let (i, _) = (speakers.iter().enumerate())
        .filter(quiet)
        .min_by_key(|(_, sp)| sp.last_text)?;
    // Its keys start at a millisecond of their own, later than the stream's start and every
    // other such speaker's: the voice may have spoken here before it left.
    let start = at.created.as_millis();
    let since = newest_key_ms(speakers, *at.created)
        .saturating_add(1)
        .max(now.as_millis());
    let sp = &mut speakers.as_mut_slice()[i];
    tracing::debug!(participant = %sp.profile.participant, "leaves to make room for a new voice");
    emit.speaker_ends(
        now,
        at.key,
        at.created,
        sp,
        "speaker limit of its RTP stream",
    );
    let joined = sp.joined;
    if let (Some(names), Voice::Csrc(id), 1..=2) = (names, &sp.voice, sp.profile.name_rank) {
        keep_name(
            names,
            EarlyName {
                ip: at.key.source.ip(),
                id: *id,
                name: std::mem::take(&mut sp.profile.name),
                rank: sp.profile.name_rank,
                via: Some(*at.key),
            },
            &mut emit.stats.early_names_forgotten,
        );
    }
    *sp = Speaker::new(voice.to_voice(), at.key, now);
    // At least 1 ms after the start; a stream 49 days old saturates (its keys could repeat).
    let after = u32::try_from(since - start).unwrap_or(u32::MAX);
    sp.profile.key_since = std::num::NonZeroU32::new(after);
    emit.stats.speakers_recycled += 1;
    Some((i, joined))
}

/// The newest millisecond a stream's context keys name: its start (`created`), or a later one
/// of a speaker that took a place at the speaker bound ([`make_room`]).
fn newest_key_ms(speakers: &crate::stream::Speakers, created: Time) -> u64 {
    (speakers.iter())
        .map(|s| s.profile.key_start(created).as_millis())
        .fold(created.as_millis(), u64::max)
}

/// Nothing but loss marks and white space: from a speaker yet to join, no chunk is sent
/// (README "Loss": no one joins only to say U+FFFD).
fn marks_only(text: &str) -> bool {
    text.chars().all(|c| c == '\u{fffd}' || c.is_whitespace())
}

/// Whether a speaker of the stream joined (and is joined still, or left since,
/// [`crate::stream::Mixer::spoke`]): for good, the stream is no eviction candidate any more
/// ([`Gateway::evict_silent_stream`]).
fn spoke(s: &Stream) -> bool {
    s.mixer.spoke || s.speakers.iter().any(|sp| sp.joined)
}

/// Whether a speaker holds text not yet sent other than loss marks (a junk SSRC's lost head
/// holds a U+FFFD it will never send, [`marks_only`]): spared until its flush, which joins the
/// speaker, or a backspace left with nothing to send.
fn holds_words(s: &Stream) -> bool {
    (s.speakers.iter()).any(|sp| !marks_only(sp.chunker.pending()))
}

/// Whether a stream that carried no text yet may: a packet held behind a gap has text (the
/// reorder wait gives it out or up), or, while its last packet is within `wait` (the reorder
/// wait) of `now`, a packet a restart's run keeps has text, or a speaker's decoder holds part
/// of a character or is inside a control function (an escape sequence begun). It stays an
/// eviction candidate, tried after the others ([`Gateway::evict_silent_stream`]): what it
/// holds may come to nothing. Past the wait, a run, character or sequence left unfinished
/// spares it no longer: a flood of SSRCs each sending one ESC, a lead byte or a jump would
/// otherwise hold every place until the stream timeout and lock real callers out.
fn may_yet_speak(s: &Stream, now: Time, wait: Duration) -> bool {
    s.register.text_behind_gap()
        || (now < s.last_packet.saturating_add(wait)
            && (s.register.text_in_run()
                || (s.speakers.iter())
                    .any(|sp| sp.decoder.holds_partial() || sp.decoder.in_control())))
}

/// An eviction candidate as [`Gateway::evict_silent_stream`] finds it.
enum Candidate {
    /// Ended, or a speaker joined: no candidate any more.
    Gone,
    /// May yet speak ([`may_yet_speak`]).
    Spared,
    Evictable,
}

/// What becomes of the SDES names of speakers that end without a word
/// ([`Gateway::end_speakers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Names {
    /// Among the early names, as the newest (a stream evicted with no record: nothing came
    /// for it since).
    Newest,
    /// Among the early names unless one as high came meanwhile (a record ending: an SDES
    /// that came while it was kept is newer).
    Older,
    /// Not kept: a BYE ended the source's session (README "Stream limit").
    Forget,
}

/// A stream evicted at the stream limit that may come back ([`Gateway::remember_evicted`]).
struct Evicted {
    key: StreamKey,
    /// Its stream timeout: a return after it is a new stream.
    until: Time,
    /// Where its numbering stood (a stream holding a lost head's mark has no record).
    at: Position,
    /// Its last packet: the quiet before the return is measured from it (a t140llm reply's
    /// start is told by that quiet).
    last_packet: Time,
    /// Its speakers as they were, moved out of the stream (no copy, no allocation): made
    /// again at its return, they go on where they stood ([`Gateway::remember_evicted`]).
    speakers: Speakers,
    /// Its mixer's state across its speakers: the losses none has accounted for yet, and
    /// where they lie on its clock.
    mixer: Mixer,
    unplaced_at: Unplaced,
}

/// The sans-IO core.
pub struct Gateway {
    cfg: Config,
    emit: Emitter,
    index: StreamIndex,
    /// Slab of streams; `free` lists reusable slots.
    slots: Slab<Stream>,
    /// When each stream next needs attention, by slot.
    timers: Timers,
    serial: u64,
    /// SDES names of sources not seen on RTP yet (bounded, oldest evicted).
    early_names: Vec<EarlyName>,
    /// Streams ended, with the newest millisecond their keys used (the start, or a speaker's
    /// that took a place made at the speaker bound): one started again under its key (a BYE,
    /// then the sender's next packet, in one batch) starts a millisecond later, so its context
    /// keys (`participant/start ms/n`) are not the ended one's (pvp-spec 9.1). Every one whose
    /// millisecond has not passed is kept, however many streams end in it (the last 32 were
    /// kept before: a batch ending more lost one, and its stream's return repeated its keys;
    /// review y); the passed ones are let go once the table doubles ([`ENDED_KEPT`] at least),
    /// so its work is amortised O(1) a stream and its size that of the ends of one millisecond.
    ended: HashMap<StreamKey, u64, KeyHasher>,
    /// The size of `ended` at which its passed entries are let go.
    ended_cap: usize,
    /// When "RTCP feed lagged" was last logged ([`Gateway::rtcp_feed_lost`]), and what the
    /// feeds lost since, not yet said: a flood of the RTCP port that keeps a worker behind
    /// logs at most one line every [`crate::said::SAID_EVERY`].
    feed_lag: crate::said::Said<Time>,
    /// The last streams evicted at the stream limit that may come back: until when (their
    /// stream timeout) and where their numbering stood ([`Gateway::remember_evicted`]).
    evicted: VecDeque<Evicted>,
    /// The earliest end of a record in `evicted` ([`Gateway::expire_evicted`]); may be
    /// earlier than any left (a record taken or forgotten), which costs one scan.
    evicted_until: Time,
    /// Streams in creation order, as eviction candidates while they have not joined.
    silent: VecDeque<(u32, u64)>,
    /// Candidates a walk of `silent` found sparing themselves ([`may_yet_speak`]): tried after
    /// every one in `silent`, and again only once `spared_after` has passed.
    spared: VecDeque<(u32, u64)>,
    /// Spared candidates a walk of `spared` found sparing themselves no longer, oldest
    /// (lowest serial) first: they take their turn with `silent`'s, by age.
    unspared: BinaryHeap<Reverse<(u64, u32)>>,
    /// Until when `spared` is not walked again: the last walk found every one of them
    /// sparing itself ([`SILENT_WALK_PAUSE`]).
    spared_after: Time,
    /// Streams lingering after their source's BYE, `(slot, serial)` in the order their BYEs
    /// came ([`Gateway::stream_bye`]); entries of streams that ended since are skipped, and
    /// pruned ([`Gateway::prune_lingering`]).
    lingering: VecDeque<(u32, u64)>,
    admission: Admission,
    /// Room for streams under the limit: one claim a live stream, taken in
    /// [`Gateway::open_stream`], given back where a stream leaves the index.
    streams: Claims,
    /// The configured delays in microseconds, converted once: deadlines are computed per packet.
    delays: Delays,
    /// t140llm's packets over 255 bytes, for the RED packets that repeat them clamped.
    long_blocks: crate::clamped::LongBlocks,
    /// A t140llm RED packet refused as ambiguous (a block over 255 bytes, its length clamped),
    /// for [`Gateway::receive_unclamped`] right after its refusal is counted.
    unclamped: Vec<(SocketAddr, Vec<u8>)>,
    /// RTCP read on the RTP port that found none of this core's streams, or whose BYE it
    /// acted on, for the other receive workers ([`Gateway::share_rtcp`]); `None` while not
    /// shared.
    shared_rtcp: Option<Vec<(SocketAddr, HandedRtcp)>>,
}

/// RTCP a receive worker keeps for the others ([`Gateway::take_shared_rtcp`]), for
/// [`Gateway::handle_shared_rtcp`].
#[derive(Debug, Clone)]
pub struct HandedRtcp {
    data: Vec<u8>,
    /// Its BYE was acted on by the worker that read it, which holds the stream: the others
    /// only forget what they keep for its SSRCs (early names, evicted streams' records), as a
    /// BYE on the RTCP port makes every worker do, and end nothing of theirs.
    ended: bool,
}

#[derive(Debug, Clone, Copy)]
struct Delays {
    idle_flush: u64,
    stream_timeout: u64,
}

impl Delays {
    fn new(cfg: &Config) -> Self {
        let us = |d: Duration| Time(0).saturating_add(d).0;
        Delays {
            idle_flush: us(cfg.idle_flush),
            stream_timeout: us(cfg.stream_timeout),
        }
    }

    /// A stream's deadline while it holds no packet behind a gap: the stream timeout after its
    /// last packet, or the idle flush of a speaker holding text, whichever is first. Whether a
    /// speaker holds text reads its text buffer, a cold line with thousands of streams; an
    /// idle flush later than `assume_text_after` is counted without asking, which gives a lower
    /// bound (a speaker holding none is found out when its bound falls due, once per silence).
    /// [`Time::NEVER`] asks every speaker: the exact deadline.
    #[inline(always)]
    fn without_gap(
        self,
        last_packet: Time,
        speakers: &crate::stream::Speakers,
        assume_text_after: Time,
    ) -> Time {
        let mut at = last_packet.plus_us(self.stream_timeout);
        for sp in speakers {
            let idle_at = sp.last_text.plus_us(self.idle_flush);
            if idle_at < at && (idle_at > assume_text_after || !sp.chunker.is_blank()) {
                at = idle_at;
            }
        }
        at
    }
}

const MAX_EARLY_NAMES: usize = 256;

/// Sources one RTCP compound may name, and sources other than streams' own it may say BYE for
/// (a mixer's, RFC 3550 6.5, 6.6): no sender needs more (a stream has at most
/// [`crate::stream::MAX_SPEAKERS`] speakers, and at most 256 names wait for streams), and
/// each costs a look through those; a 64 KiB datagram of 8,000-16,000 of them kept a worker
/// 20-36 ms (review, session 38). The first of them are acted on, the rest counted.
pub const MAX_RTCP_SOURCES: usize = MAX_EARLY_NAMES;
/// An SDES name of a source not seen on RTP ([`Gateway::early_names`]): its host, SSRC (or
/// CSRC), name and rank, and, for a mixer's source whose name its stream's eviction kept (or
/// its leaving at the speaker bound, [`make_room`]), the mixer's stream, whose BYE forgets it
/// ([`Gateway::forget_evicted`], [`Gateway::stream_bye`]).
struct EarlyName {
    ip: IpAddr,
    id: u32,
    name: String,
    /// [`crate::speaker::Profile::name_rank`].
    rank: u8,
    /// The mixer whose eviction (or speaker bound) kept it, for a mixer's source: its stream's key (address and
    /// SSRC, as streams are known), so that another stream of the host with that SSRC is not it.
    via: Option<StreamKey>,
}

impl EarlyName {
    fn of(&self, ip: IpAddr, id: u32) -> bool {
        self.ip == ip && self.id == id
    }

    /// Gives the name to the speaker it came for, for its join, unless the speaker has a name
    /// of a higher rank (one made again from an eviction record keeps its NAME against a
    /// CNAME-only SDES that came meanwhile, as a live speaker does, [`Emitter::rename`]).
    fn name(self, sp: &mut Speaker) {
        if self.rank >= sp.profile.name_rank {
            sp.profile.name = self.name;
            sp.profile.name_rank = self.rank;
        }
    }
}
/// Speakers a mixer's stream makes for BYEs of sources not heard yet, at most, while none of
/// them is heard ([`Gateway::unheard_source`]): a BYE that overtook a source's only packets is
/// rare, and a conference's silent members' BYEs must not take its speakers' places.
const MAX_UNHEARD: usize = 4;
const MAX_NAME_CHARS: usize = 128;

/// Ended streams [`Gateway::ended`] holds before it lets go of those whose millisecond has
/// passed.
const ENDED_KEPT: usize = 32;

/// How long a walk of the spared eviction candidates (each may yet speak, [`may_yet_speak`])
/// that found none to evict is not made again. A flood of new SSRCs at the stream limit,
/// while every silent stream holds text behind a gap, would otherwise walk all `max_streams`
/// of them for each datagram refused, for up to a reorder wait: one walk in 50 ms is at most
/// a few milliseconds of work at 100,000 streams. Only the spared wait: a stream opened since
/// is a candidate at once. A spared one that came to nothing meanwhile waits out the pause;
/// the new stream is refused, or a lingering one ends, as a moment earlier.
const SILENT_WALK_PAUSE: Duration = Duration::from_millis(50);

/// Evicted streams [`Gateway::evicted`] remembers: a caller silent since its BOM comes back
/// unharmed unless more streams than this were evicted before its next packet.
const EVICTED_KEPT: usize = 64;

/// An SDES item as a speaker keeps it ([`crate::speaker::Profile::name`]): trimmed, else as
/// it came, so an `rtcp_name` rule matches the item the sender sent; `None` when it leaves no
/// display name. Trimmed of NULs and a BOM too: some senders end an item with the C string's
/// NUL, or begin it with a BOM (RFC 3550 6.5: UTF-8 text, neither), and a rule for "Alice"
/// did not match "Alice\0".
///
/// Borrowed from the item: no allocation for one of at most [`MAX_NAME_CHARS`] characters
/// (every compound repeats its CNAME, RFC 3550 6.1).
fn sdes_item(name: &str) -> Option<&str> {
    let name = name.trim_matches(|c: char| c.is_whitespace() || matches!(c, '\0' | '\u{feff}'));
    shows_a_name(name).then_some(name)
}

/// Whether [`clean_name`] leaves something of `name`, without its allocations where no cut
/// to [`MAX_NAME_CHARS`] can be needed: then what is left is `name` without what
/// [`not_in_names`] keeps out, so something is left when a character is neither that nor
/// [`shows_nothing`].
fn shows_a_name(name: &str) -> bool {
    if name.chars().nth(MAX_NAME_CHARS).is_none() {
        return name.chars().any(|c| !not_in_names(c) && !shows_nothing(c));
    }
    clean_name(name).is_some()
}

/// Whether `c` shows nothing on its own: white space, and Unicode's default ignorable code
/// points (the zero width space and joiners, direction marks, the Hangul fillers, variation
/// selectors, tags): those a chunk of which only is never sent ([`crate::chunker::blank`],
/// the one list). A name of nothing else is blank on screen (the Hangul filler U+3164 is the
/// usual way to pass for nobody), so it is no name; inside one they stay (a zero width joiner
/// holds an emoji sequence together).
#[inline]
pub fn shows_nothing(c: char) -> bool {
    crate::chunker::blank(c)
}

/// Whether `c` is kept out of a participant's display name: controls, as from the text (a
/// name reaches PVP clients' screens and the log line of the join, where an escape sequence or
/// a new line could pass for something else), U+2028 and U+2029 (new lines too, README "Text
/// decoding"), and the bidirectional embeddings, overrides and isolates (U+202A-U+202E,
/// U+2066-U+2069), with which a name left open turns the text shown after it around (Trojan
/// Source, CVE-2021-42574). `pvp-t140 send --name` refuses a name with one.
pub fn not_in_names(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A name as a participant's display name: without what [`not_in_names`] keeps out, at most
/// [`MAX_NAME_CHARS`] (cut between grapheme clusters, so an emoji or a letter and its accent
/// is whole or gone), trimmed; `None` when nothing is left that shows ([`shows_nothing`]).
pub(crate) fn clean_name(name: &str) -> Option<String> {
    use unicode_segmentation::UnicodeSegmentation;
    let mut name: String = name.chars().filter(|&c| !not_in_names(c)).collect();
    if name.chars().nth(MAX_NAME_CHARS).is_some() {
        let mut chars = 0;
        let end = (name.grapheme_indices(true))
            .find(|(_, g)| {
                chars += g.chars().count();
                chars > MAX_NAME_CHARS
            })
            .map_or(name.len(), |(i, _)| i);
        name.truncate(end);
    }
    let name = name.trim();
    name.chars()
        .any(|c| !shows_nothing(c))
        .then(|| name.to_owned())
}
/// Register tag for "no speaker decided at arrival": resolved per block when delivered.
const TAG_UNDECIDED: u16 = u16::MAX;

/// Datagrams [`Gateway::warm`] prepares in one call.
pub const WARM_BATCH: usize = 32;

/// Streams from which [`Gateway::warm`] does its work. Measured here (`examples/core_drive`,
/// arrivals in random order, 1 MiB of L2 per core, 32 MiB of L3 shared with other guests):
/// with 1,000 and 3,000 streams it cost about 20 ns a packet; with 10,000 it saved 0-50%, the
/// more the busier the machine's memory was.
pub const WARM_FROM: usize = 4096;

impl Gateway {
    /// A core with a stream budget of its own, `cfg.max_streams`.
    pub fn new(cfg: Config) -> Self {
        let budget = StreamBudget::new(cfg.max_streams, 1);
        Gateway::with_budget(cfg, budget)
    }

    /// A core whose streams count against `budget`, shared with the other cores it is cloned
    /// to (`--workers`: the limit is the gateway's, each core guaranteed a part of it,
    /// [`crate::budget`]); `cfg.max_streams` is not read.
    pub fn with_budget(cfg: Config, budget: StreamBudget) -> Self {
        let t140llm = cfg.compat == Compat::T140llm;
        let pvp = Builder::new(cfg.session.clone(), cfg.token.clone(), cfg.id_seed);
        let roles = cfg.roles.clone();
        let admission = Admission::new(cfg.allow.clone(), cfg.max_pps_per_source);
        let mapping = cfg.mapping.clone();
        let mut said = Output::new(cfg.max_chunk_chars);
        said.cuts.erase_clusters(cfg.compat == Compat::T140llm);
        Gateway {
            admission,
            streams: Claims::new(budget),
            delays: Delays::new(&cfg),
            cfg,
            emit: Emitter {
                pvp,
                out: VecDeque::new(),
                stats: Stats::default(),
                said,
                roles,
                mapping,
                t140llm,
            },
            index: StreamIndex::default(),
            slots: Slab::default(),
            timers: Timers::default(),
            serial: 0,
            early_names: Vec::new(),
            ended: HashMap::default(),
            ended_cap: ENDED_KEPT,
            feed_lag: crate::said::Said::default(),
            evicted: VecDeque::new(),
            evicted_until: Time::NEVER,
            silent: VecDeque::new(),
            spared: VecDeque::new(),
            unspared: BinaryHeap::new(),
            spared_after: Time::from_micros(0),
            lingering: VecDeque::new(),
            long_blocks: Default::default(),
            unclamped: Vec::new(),
            shared_rtcp: None,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters, including those of live streams (harvested as they change: O(1)).
    pub fn stats(&self) -> Stats {
        let mut s = self.emit.stats.clone();
        let said = &self.emit.said;
        s.decode.add(&said.decode);
        s.recovered += said.recovered;
        s.lost += said.lost;
        s
    }

    pub fn live_streams(&self) -> usize {
        self.index.len()
    }

    /// Next envelope to send, in the order they must be sent.
    pub fn poll_output(&mut self) -> Option<Envelope> {
        self.emit.out.pop_front()
    }

    /// Envelopes made and not yet taken by [`Gateway::poll_output`].
    pub fn pending_output(&self) -> usize {
        self.emit.out.len()
    }

    /// When [`Gateway::handle_timeout`] next has work (reorder wait, idle flush, timeout, the
    /// end of an evicted stream's record).
    pub fn poll_timeout(&self) -> Option<Time> {
        // An evicted stream's record ends as the timers run ([`Gateway::expire_evicted`]), so
        // its end is a deadline too.
        let next = (self.timers.next().unwrap_or(Time::NEVER)).min(self.evicted_until);
        (next != Time::NEVER).then_some(next)
    }

    /// A hint for a driver holding a batch of datagrams, called before
    /// [`Gateway::handle_datagram`] handles them: loads the cache lines each datagram's stream
    /// will read. With thousands of streams arriving in no particular order every packet finds
    /// its stream cold, and one miss after another dominates its cost; here the batch's
    /// misses overlap instead (docs/performance.md, sections 10 and 11). Looks at the first
    /// [`WARM_BATCH`] datagrams. Changes nothing: skipping it changes only speed.
    /// [`Gateway::handle_batch`] does this and keeps the lookups.
    pub fn warm<'a>(&self, batch: impl IntoIterator<Item = (SocketAddr, &'a [u8])>) {
        self.warm_slots(batch);
    }

    /// [`Gateway::warm`]'s work, in passes, so that few instructions stand between the loads of
    /// different streams: the index lookups (small enough to stay cached) giving slots only,
    /// the streams' lines and their timer slots, then their text buffers, whose address is in a
    /// stream line. Returns the slots found, by position. Below [`WARM_FROM`] streams it
    /// returns at once, since the lines are cached and the lookups would cost more than they
    /// save.
    fn warm_slots<'a>(
        &self,
        batch: impl IntoIterator<Item = (SocketAddr, &'a [u8])>,
    ) -> [Option<u32>; WARM_BATCH] {
        let mut slots: [Option<u32>; WARM_BATCH] = [None; WARM_BATCH];
        if self.index.len() < WARM_FROM {
            return slots;
        }
        // Slots only: reading a stream here would put a miss in every long iteration (the
        // key's hash), and few would be in flight at once.
        for (found, (source, data)) in slots.iter_mut().zip(batch) {
            let Some(ssrc) = crate::rtp::peek_ssrc(data) else {
                continue;
            };
            *found = self.index.get(&StreamKey { source, ssrc });
        }
        let mut folded = 0u64;
        let mut speakers: [Option<&Speaker>; WARM_BATCH] = [None; WARM_BATCH];
        for (&slot, speaker) in slots.iter().zip(&mut speakers) {
            let Some(slot) = slot else { continue };
            folded ^= self.timers.touch(slot);
            if let Some(s) = self.slots.get(slot) {
                let (v, own) = s.touch();
                folded ^= v;
                *speaker = own;
            }
        }
        for s in speakers.iter().flatten() {
            folded ^= u64::from(s.chunker.touch());
        }
        std::hint::black_box(folded);
        slots
    }

    /// Datagrams a driver read together, received at `now`: the same as
    /// [`Gateway::handle_datagram`] on each in turn, but each run of [`WARM_BATCH`] is first
    /// warmed ([`Gateway::warm`]), and the streams that warming found are not looked up a second
    /// time while no stream has been opened or closed since (callgrind, 10,000 streams: one
    /// index lookup a packet instead of two).
    pub fn handle_batch(&mut self, now: Time, batch: &[(SocketAddr, &[u8])]) {
        for run in batch.chunks(WARM_BATCH) {
            let slots = self.warm_slots(run.iter().copied());
            let at = self.index.changes();
            for (&(source, data), &slot) in run.iter().zip(&slots) {
                self.handle_hinted(now, source, data, slot.map(|s| (s, at)), true);
            }
        }
    }

    /// One UDP datagram from `source`, received at `now`.
    pub fn handle_datagram(&mut self, now: Time, source: SocketAddr, data: &[u8]) {
        self.handle_hinted(now, source, data, None, true);
    }

    /// A datagram from the RTCP port (RFC 3550 11: the RTP port + 1). It comes from the
    /// sender's RTCP port, not the one its RTP arrives from, so which receive worker holds its
    /// stream is unknown: every worker is handed it and acts on it for the streams it holds,
    /// and only the one that `counts` counts it, so it shows once. The port's reader admits it
    /// (`refused`: `--allow`, `--max-pps-per-source`), once for all workers, so that what one
    /// counts as refused none acts on ([`crate::admission::Admission`], one for the port).
    pub fn handle_rtcp_port(
        &mut self,
        now: Time,
        source: SocketAddr,
        data: &[u8],
        refused: Option<Refusal>,
        counts: bool,
    ) {
        // Every worker has it already: none hands it on ([`Gateway::share_rtcp`]).
        let shared = self.shared_rtcp.take();
        if counts {
            match refused {
                None if looks_like_rtcp(data) => self.handle_hinted(now, source, data, None, false),
                _ => self.not_rtcp_on_rtcp_port(now, source, data, refused),
            }
        } else {
            self.fire_due(now);
            if refused.is_none() && looks_like_rtcp(data) {
                // Its malformed parts are counted by the worker that counts.
                let _ = self.receive_rtcp(now, source, data, false);
            }
        }
        self.shared_rtcp = shared;
    }

    /// `n` datagrams of the RTCP port (`bytes` in all) that its reader refused (`--allow`,
    /// `--max-pps-per-source`), counted where the reader left them (`udp::RtcpRefused`) rather
    /// than each handed over: counted as [`Gateway::handle_rtcp_port`] counts one refused, by
    /// the worker that counts the port's datagrams.
    pub fn rtcp_port_refused(&mut self, refused: Refusal, n: u64, bytes: u64) {
        let reason = DropReason::from(refused);
        self.emit.stats.datagrams += n;
        self.emit.stats.bytes += bytes;
        self.emit.stats.drops[reason.index()] += n;
    }

    /// With several receive workers: keep RTCP read on the RTP port (rtcp-mux, RFC 5761) that
    /// finds none of this core's streams, or whose BYE ends one of them, for
    /// [`Gateway::take_shared_rtcp`], so the shell hands it to the other workers
    /// ([`Gateway::handle_shared_rtcp`]). A sender may send its RTCP from another port than its
    /// RTP (RFC 3550 8.2), and the kernel's SO_REUSEPORT hash then takes it to a worker of its
    /// own, which need not hold the stream (README, Scaling out). The shell that turns this on
    /// takes what is kept after each batch.
    pub fn share_rtcp(&mut self) {
        self.shared_rtcp.get_or_insert_with(Vec::new);
    }

    /// What [`Gateway::share_rtcp`] kept since the last call, oldest first: (source, datagram).
    pub fn take_shared_rtcp(&mut self) -> Vec<(SocketAddr, HandedRtcp)> {
        self.shared_rtcp
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// RTCP another worker read on the RTP port ([`Gateway::share_rtcp`]), not counted (the
    /// worker that read it counted and admitted it), not handed on again. One that found none
    /// of that worker's streams is acted on for this core's streams by the same rules. One
    /// whose BYE that worker acted on ended its stream there: here it only forgets what was
    /// kept for the SSRCs it ends, since an SDES handed on before the stream's first packet
    /// left an early name here too (README, Streams: kept "unless a BYE came").
    pub fn handle_shared_rtcp(&mut self, now: Time, source: SocketAddr, rtcp: &HandedRtcp) {
        if !rtcp.ended {
            return self.handle_rtcp_port(now, source, &rtcp.data, None, false);
        }
        self.fire_due(now);
        let source = canonical(source);
        let (mut byes, mut sender) = (smallvec::SmallVec::<[u32; 8]>::new(), None);
        crate::rtcp::parse(&rtcp.data, &mut |e| {
            if let RtcpEvent::Bye { ssrc } = e {
                byes.push(ssrc);
            }
            sender = sender.or(Some(rtcp_ssrc(&e)));
        });
        for ssrc in byes {
            self.forget_evicted(source, ssrc, sender);
        }
    }

    /// `n` errors the receive socket returned to reads (an ICMP's ECONNREFUSED, ENOBUFS, ...):
    /// the shell reads past them, pausing while they persist (`udp::ErrorPause`); counted
    /// here so that they show in the metrics with the rest of this worker's counters.
    pub fn socket_errors(&mut self, n: u64) {
        self.emit.stats.socket_errors += n;
    }

    /// `n` more datagrams the kernel dropped for the receive socket before the shell could read
    /// them (a receive buffer overrun: `--recv-buffer`, `net.core.rmem_max`): text the senders
    /// sent that never reached the core, counted so that the datagrams read and these add up to
    /// what reached the host.
    pub fn kernel_drops(&mut self, n: u64) {
        self.emit.stats.kernel_drops += n;
    }

    /// `n` datagrams of the RTCP port that this worker's feed lost (it fell behind the port's
    /// reader): its streams did not see them (`rtcp_feed_missed`, every worker's own); the
    /// worker that counts the port's datagrams ([`Gateway::handle_rtcp_port`]) counts them as
    /// received and dropped too, since it counted them nowhere else. For RTCP other workers
    /// handed on ([`Gateway::share_rtcp`]), `counts` is false: the worker that read them
    /// counted them.
    ///
    /// Logged at warn level the first time, then at most once every [`crate::said::SAID_EVERY`]
    /// with what was lost since (`skipped`): anyone who can reach the RTCP port can keep a
    /// worker behind, and a line a lag flooded the log.
    pub fn rtcp_feed_lost(&mut self, now: Time, n: u64, counts: bool) {
        if let Some(skipped) = self.feed_lag.tell(now, n) {
            tracing::warn!(
                skipped,
                "RTCP feed lagged: a receive worker fell behind the RTCP it is handed; what it \
                 skipped is counted (rtcp_feed_missed), logged at most every 10 s"
            );
        }
        self.emit.stats.rtcp_feed_missed += n;
        if counts {
            self.emit.stats.datagrams += n;
            self.emit.stats.drops[DropReason::RtcpFeedLagged.index()] += n;
        }
    }

    /// `hint`: where the datagram's stream was found, and [`StreamIndex::changes`] then. The
    /// slot is used only if the index is still unchanged where the stream is needed, after
    /// the timers due have fired (they may end the stream); else the stream is looked up.
    /// `admit`: false for a datagram admitted already (the RTCP port's, by its reader).
    #[inline(always)]
    fn handle_hinted(
        &mut self,
        now: Time,
        source: SocketAddr,
        data: &[u8],
        hint: Option<(u32, u64)>,
        admit: bool,
    ) {
        // Timers due before this packet fire first, each at its own deadline, so replay
        // matches what happened on the wire (text released and flushes cut when they were due).
        self.fire_due(now);
        self.emit.stats.datagrams += 1;
        self.emit.stats.bytes += data.len() as u64;
        let admitted = match admit {
            true => self.admission.admit(now, source).map_err(DropReason::from),
            false => Ok(()),
        };
        if let Err(reason) = admitted.and_then(|()| self.receive(now, &source, data, hint)) {
            self.drop_datagram(source, data, reason);
            if !self.unclamped.is_empty() {
                // Before the batch's next datagram: it may be the stream's next packet.
                self.receive_unclamped(now);
            }
        }
    }

    /// The t140llm RED packet just refused as ambiguous ([`Gateway::unclamped`]), received
    /// again at `now` if [`crate::clamped`] can read it: at once, before the next datagram,
    /// which may be its stream's next packet. Out of the packet path: called only after a
    /// refusal, where the retry cost nothing measurable; a call in `receive` cost the batch
    /// loop 20 instructions a packet (callgrind, `core_drive`), cold though it was.
    #[cold]
    #[inline(never)]
    fn receive_unclamped(&mut self, now: Time) {
        for (source, data) in std::mem::take(&mut self.unclamped) {
            let Ok(unclamped) = self.unclamp(source, &data) else {
                continue;
            };
            // Counted as dropped when it was refused: it is not.
            self.emit.stats.drops[DropReason::Red(RedError::AmbiguousLength).index()] -= 1;
            self.emit.stats.red_unclamped += 1;
            if let Err(reason) = self.receive(now, &source, &unclamped, None) {
                self.drop_datagram(source, &unclamped, reason);
            }
        }
    }

    /// The RTCP port reads RTCP only, on every worker alike: RTP (or anything else) sent there
    /// is no one's text. Counted, admitted (`--allow`, the rate limit) and logged as any
    /// datagram, then dropped as what it is not. Out of the packet path ([`Gateway::handle_hinted`]
    /// measured 4 instructions a packet more with it as a flag there).
    #[cold]
    #[inline(never)]
    fn not_rtcp_on_rtcp_port(
        &mut self,
        now: Time,
        source: SocketAddr,
        data: &[u8],
        refused: Option<Refusal>,
    ) {
        self.fire_due(now);
        self.emit.stats.datagrams += 1;
        self.emit.stats.bytes += data.len() as u64;
        let reason = refused.map_or(DropReason::RtcpMalformed, DropReason::from);
        self.drop_datagram(source, data, reason);
    }

    /// A datagram dropped: counted by reason, logged at debug level.
    #[cold]
    #[inline(never)]
    fn drop_datagram(&mut self, source: SocketAddr, data: &[u8], reason: DropReason) {
        if reason == DropReason::T140llmNotText && self.emit.stats.drops(reason) == 0 {
            tracing::warn!(
                %source,
                reason = reason.as_str(),
                "a t140llm packet's payload is not UTF-8 text: dropped, as every such one is \
                 (counted). t140llm's SRTP mode looks like this; pvp-t140 does not decrypt SRTP"
            );
        }
        self.emit.stats.drops[reason.index()] += 1;
        tracing::debug!(%source, len = data.len(), reason = reason.as_str(), "datagram dropped");
    }

    fn red_format(&self) -> RedFormat {
        match self.cfg.compat {
            Compat::None => RedFormat::Rfc2198,
            Compat::T140llm => RedFormat::T140llm,
        }
    }

    /// One datagram's work after its timers and admission. `source` by reference: by value,
    /// the batch loop built the 32-byte copy for the call field by field once unrelated cold
    /// code changed its register allocation (callgrind, `core_drive` 10,000 streams: 33
    /// instructions a packet).
    #[inline(never)]
    fn receive(
        &mut self,
        now: Time,
        source: &SocketAddr,
        data: &[u8],
        hint: Option<(u32, u64)>,
    ) -> Result<(), DropReason> {
        let source = *source;
        if looks_like_rtcp(data) {
            self.emit.stats.rtcp += 1;
            return self.receive_rtcp(now, source, data, true);
        }
        let pkt = RtpPacket::parse(data).map_err(DropReason::Rtp)?;
        let compat = self.cfg.compat;
        let format = self.red_format();
        let mut payload = pkt.payload;
        let parsed = if pkt.payload_type == self.cfg.t140_pt {
            None
        } else if pkt.payload_type == self.cfg.red_pt {
            // Validated before a stream is created for it, so junk opens no stream; the parse
            // travels with the packet into the register.
            let p = match RedPayload::parse_as(payload, format) {
                Ok(p) => p,
                Err(RedError::AmbiguousLength) => {
                    self.unclamped.push((source, data.to_vec()));
                    return Err(DropReason::Red(RedError::AmbiguousLength));
                }
                Err(e) => return Err(DropReason::Red(e)),
            };
            if p.was_newest_first() {
                self.emit.stats.red_newest_first += 1;
            }
            if !p.blocks_all_of(self.cfg.t140_pt) {
                self.emit.stats.red_block_pt_other += 1;
            }
            Some(p)
        } else if compat == Compat::T140llm && pkt.payload_type == T140LLM_FEC_PT {
            return Err(DropReason::T140llmFec);
        } else {
            return Err(DropReason::UnknownPayloadType);
        };
        let red = parsed.is_some();
        if compat == Compat::T140llm {
            // A RED packet's primary only: in t140llm's multiplexing with RED its blocks begin
            // with raw CSRC bytes (docs/t140llm.md section 6), not UTF-8 from CSRC 128 on.
            let text = utf8_inside(parsed.as_ref().map_or(payload, |p| p.primary().data));
            if !text {
                return Err(DropReason::T140llmNotText);
            }
            if !red && pkt.marker && payload.starts_with(b"MD:{") {
                // Metadata, not text: it still takes its sequence number, so it passes as empty.
                self.emit.stats.metadata += 1;
                payload = &[];
            }
            if data.len() >= 12 + 255 - crate::clamped::MAX_PREFIX {
                self.note_long_block(source, &pkt, parsed.as_ref(), data);
            }
        }
        let key = StreamKey {
            source,
            ssrc: pkt.ssrc,
        };
        // A slot found before this datagram's timers fired holds only if none ended a stream.
        let found = hint.filter(|&(_, at)| self.index.changes() == at);
        let slot = match found.map(|(slot, _)| slot).or_else(|| self.index.get(&key)) {
            Some(slot) => slot,
            None => {
                // A reply's start: its packet 0, or (packet 0 lost) a packet whose redundancy
                // carries it.
                if compat == Compat::T140llm {
                    if pkt.sequence == 0 && pkt.timestamp == 0 {
                        self.end_replied_stream(now, key, Duration::ZERO);
                    } else if carries_reply_start(pkt.sequence, pkt.timestamp, parsed.as_ref()) {
                        self.end_replied_stream(now, key, T140LLM_REPLY_GAP);
                    }
                }
                self.open_stream(now, key)?
            }
        };
        let csrc = match (self.cfg.mixer, pkt.csrcs().len()) {
            (MixerMode::Off, _) | (_, 0) => None,
            (MixerMode::Auto, 1) | (MixerMode::On, _) => pkt.csrcs().next(),
            (MixerMode::Auto, _) => None,
        };
        let stream = self.slots.get_mut(slot).expect("indexed slot is live");
        stream.packets += 1;
        // Not `Voices::of`: looking the tag's speaker up on the fields first, then bundling
        // them, measured 10 instructions a packet fewer (callgrind, 1 stream). The key goes by
        // reference: it sits in the stream's cold tail, read only by a new speaker or a flush.
        let Stream {
            register,
            speakers,
            own,
            mixer,
            key,
            created,
            format,
            bye_waits,
            unplaced_at,
            // Set to `now` on each way out below (before the in-order path's timers fire): the
            // in-order path does not read the old one.
            last_packet,
            ..
        } = stream;
        let tag = match (csrc, compat) {
            (Some(c), _) => {
                // Before a new source's speaker is made: the next session's packet must not
                // make it (nor give it an early name) in the stream its BYE is ending.
                if *bye_waits && !register.sent_before_bye(pkt.sequence, pkt.marker) {
                    *last_packet = now;
                    return self.new_session_after_bye(now, slot, source, data);
                }
                let before = speakers.len();
                // Not for a packet behind the stream (a late duplicate, which the register
                // drops): a speaker would leave for a voice that says nothing.
                let room = (before >= crate::stream::MAX_SPEAKERS
                    && register.is_ahead(pkt.sequence))
                .then(|| {
                    let held = |i: usize| register.holds_tag(i as u16);
                    let at = Place { key, created };
                    make_room(
                        &mut self.emit,
                        Some(&mut self.early_names),
                        speakers,
                        *own,
                        at,
                        now,
                        VoiceRef::Csrc(c),
                        &held,
                    )
                })
                .flatten();
                mixer.spoke |= room.is_some_and(|(_, joined)| joined);
                let i = speaker_index(speakers, own, key, VoiceRef::Csrc(c), now);
                let made = speakers.len() > before || room.map(|(r, _)| r) == Some(i);
                if made && speakers[i].voice.as_ref() == VoiceRef::Csrc(c) {
                    // A mixer's source's SDES (the mixer reports for its sources, RFC 3550
                    // 6.5) may have come before the source's first packet. Not the own voice
                    // made for it past the bound: that speaks for every such source.
                    name_new_speaker(&mut self.early_names, key, c, &mut speakers[i]);
                }
                i
            }
            (None, Compat::T140llm) => usize::from(TAG_UNDECIDED),
            (None, Compat::None) => speaker_index(speakers, own, key, VoiceRef::Ssrc, now),
        } as u16;
        let mut voices = Voices {
            speakers,
            own,
            mixer,
            unplaced_at,
            key,
            created,
            format: *format,
            compat,
        };
        if csrc.is_none() && register.advance_in_order(pkt.sequence, pkt.timestamp, parsed.as_ref())
        {
            // In order, nothing waiting: the primary block straight to its speaker.
            *last_packet = now;
            let text = parsed.map_or(payload, |p| p.primary().data);
            route(&mut self.emit, &mut voices, now, tag, Piece::Text(text));
            let due = self.delays.without_gap(now, voices.speakers, now);
            self.arm_after_packet(now, slot, due);
            return Ok(());
        }
        // Off the in-order path, the stream's last packet before this one is still known: a
        // t140llm reply's start is told by the quiet before it (below).
        let quiet_since = std::mem::replace(last_packet, now);
        // A stream whose BYE waits comes this way, never the one above, so its deadline (the
        // BYE's) is armed below. (A mixer's packets were checked before their speaker's
        // lookup.)
        if *bye_waits && !register.sent_before_bye(pkt.sequence, pkt.marker) {
            return self.new_session_after_bye(now, slot, source, data);
        }
        let arrival = Arrival {
            seq: pkt.sequence,
            ts: pkt.timestamp,
            marker: pkt.marker,
            red,
            tag,
            by_ts: csrc.is_some(),
            at: now,
            payload,
            parsed,
        };
        let emit = &mut self.emit;
        let head = compat == Compat::T140llm && pkt.sequence == 0 && pkt.timestamp == 0;
        // Its own bytes (an `MD:` packet's too, though it passes as empty).
        let head_fp = if head { fingerprint(pkt.payload) } else { 0 };
        if compat == Compat::T140llm
            && ((head && register.is_next_reply_head(head_fp))
                || (quiet_since.saturating_add(self.cfg.reorder_wait) < now
                    && (head
                        || (!register.is_ahead(pkt.sequence)
                            && carries_reply_start(pkt.sequence, pkt.timestamp, parsed.as_ref())))))
        {
            // t140llm begins every reply at sequence 0 and timestamp 0: after a quiet spell,
            // such a packet is a reply's start, not a late copy of the last reply's; so is one
            // behind the stream whose redundancy carries it (packet 0 lost), and, however soon,
            // a packet 0 whose bytes are not the last packet 0's (a copy's would be).
            if register.start_anew(&mut |tag, piece| route(emit, &mut voices, now, tag, piece)) {
                // The last reply is over: what it left buffered is its last item, not the
                // start of this one's (it ran into it, "here.Second").
                for sp in voices.speakers.iter_mut() {
                    emit.idle_flush(now, voices.key, voices.created, sp);
                }
            }
        }
        if head {
            register.note_reply_head(head_fp);
        }
        let outcome = register
            .receive(now, arrival, &mut |tag, piece| {
                route(emit, &mut voices, now, tag, piece)
            })
            .map_err(DropReason::Red);
        // Speakers count into the gateway's `Output` as `route` feeds them; the register's
        // counters are harvested here.
        // Set while a mixer's source's leave waits, and until `settle_byes` finds none does:
        // a leave the packet just said (`route`) is settled too.
        let byes = register.leave_waits();
        let speakers = voices.speakers;
        emit.stats.harvest(register);
        // Armed whatever the outcome: the packet may have opened the stream.
        let mut due = match register.held() {
            0 => self.delays.without_gap(now, speakers, now),
            _ => self.deadline(self.slots.get(slot).expect("live")),
        };
        if byes {
            self.settle_byes(now, slot);
            due = self.deadline(self.slots.get(slot).expect("live"));
        }
        if self.slots.get(slot).expect("live").bye_waits {
            self.after_bye_packet(now, slot, due);
        } else {
            self.arm_after_packet(now, slot, due);
        }
        let outcome = outcome?;
        match outcome {
            // A jump's packet is kept until a restart is confirmed; those that prove strays
            // or late copies count as drops when they are let go (`harvest`).
            Outcome::Delivered | Outcome::Held | Outcome::Jump => Ok(()),
            Outcome::Stale => Err(DropReason::Stale),
        }
    }

    /// What t140llm repeats this packet as in its next RED packets: a packet over 255 bytes is
    /// repeated with its length clamped ([`crate::clamped`]), and so is a RED primary that a
    /// multiplex prefix takes over 255.
    #[cold]
    #[inline(never)]
    fn note_long_block(
        &mut self,
        source: SocketAddr,
        pkt: &RtpPacket<'_>,
        parsed: Option<&RedPayload<'_>>,
        data: &[u8],
    ) {
        let (block, bare) = parsed.map_or((&data[12..], false), |p| (p.primary().data, true));
        (self.long_blocks).note(source, pkt.ssrc, pkt.sequence, block, bare);
    }

    /// A t140llm RED packet with a block over 255 bytes, its length clamped (only the t140llm
    /// layout is refused so: [`RedError::AmbiguousLength`]), with the clamped blocks emptied,
    /// when the packets they repeat came ([`crate::clamped`]); else refused as ambiguous.
    #[cold]
    #[inline(never)]
    fn unclamp(&self, source: SocketAddr, data: &[u8]) -> Result<Vec<u8>, DropReason> {
        let pkt = RtpPacket::parse(data).map_err(DropReason::Rtp)?;
        let (ssrc, seq) = (pkt.ssrc, pkt.sequence);
        crate::clamped::unclamp(&self.long_blocks, source, ssrc, seq, data, pkt.payload)
            .map_err(DropReason::Red)
    }

    /// t140llm opens a new UDP socket for every reply (a `T140RtpTransport` each) and closes it
    /// at the reply's end, so a sender configured with a fixed `ssrc` sends each reply from a
    /// new port, from sequence 0 and timestamp 0 (docs/t140llm.md section 3). Such a start (or,
    /// packet 0 lost, a RED packet carrying it as redundancy, docs/t140llm.md section 5), from
    /// the host of the stream that holds its SSRC on this core, ends that stream (the last
    /// reply's), so that the new one is not refused as [`DropReason::SsrcConflict`] until the
    /// old one times out. Not only after a quiet spell: the next reply's first packet comes one
    /// tick of t140llm's 100 ms pacer after the last reply ended, as close as a reply's own
    /// packets follow each other. (Two transports sending at once with one configured SSRC: the
    /// later reply takes it over, and the earlier one's packets are refused from then on.) A
    /// start known only by its redundancy ends the stream only if it has been `quiet` this
    /// long: the earlier transport's packets 1 and 2 carry its packet 0 too.
    #[cold]
    #[inline(never)]
    fn end_replied_stream(&mut self, now: Time, key: StreamKey, quiet: Duration) {
        let source = canonical(key.source);
        let Some(owner) = self.streams.owner(key.ssrc) else {
            return;
        };
        if owner == source || owner.ip() != source.ip() {
            return;
        }
        let old = StreamKey {
            source: owner,
            ssrc: key.ssrc,
        };
        if let Some(slot) = self.index.get(&old)
            && now.saturating_sub(self.slots.get(slot).expect("live").last_packet) >= quiet
        {
            self.close_stream(now, slot, "t140llm reply from a new port");
        }
    }

    /// Out of line: a stream opens once, and its set-up (the SSRC's owner, the limit, early
    /// names, a restart's start) would otherwise sit in the packet path's code.
    #[inline(never)]
    fn open_stream(&mut self, now: Time, key: StreamKey) -> Result<u32, DropReason> {
        // The stream is known by its source's own address ([`canonical`]): its participant
        // id, the mapping rules and the SSRC's owner see IPv4 senders to a dual-stack
        // listener as IPv4.
        let key = StreamKey {
            source: canonical(key.source),
            ..key
        };
        // A stream from another source may hold it, on this core or (`--workers`) another's
        // ([`crate::budget`]): taken here, given back if the stream is refused below, or when
        // it ends (unless another source holds it by then, taken after this stream's BYE).
        if !self.streams.own_ssrc(key.ssrc, key.source) {
            return Err(DropReason::SsrcConflict);
        }
        // Before room is made: the eviction that makes it is remembered too, and may push out
        // this stream's own record ([`EVICTED_KEPT`]). Refused, the record is gone: the packet
        // refused is lost, and the next one's fresh start marks that (a lost head) as the
        // record's gap would have.
        let returning = self.returning(&key, now);
        // Its SDES name too: the eviction's names go among the early names, and may push out
        // the oldest, this one ([`MAX_EARLY_NAMES`]). Refused, it is put back for the next try.
        let early = take_early_name(&mut self.early_names, key.source.ip(), key.ssrc);
        // So are those of a returning mixer's sources that came while it was evicted.
        let sources_early: Vec<EarlyName> = returning.as_ref().map_or(Vec::new(), |r| {
            (r.speakers.iter())
                .filter_map(|sp| match sp.voice {
                    Voice::Csrc(c) => take_early_name(&mut self.early_names, key.source.ip(), c),
                    _ => None,
                })
                .collect()
        });
        // A core under its reserve always has room ([`crate::budget`]). Beyond it, at a full
        // pool, room is made from this core's own streams; another core may take the room
        // given back before it is claimed again, and then more is made or the stream is
        // refused.
        while !self.streams.claim() {
            if !self.evict_silent_stream(now) && !self.end_a_lingering_stream(now) {
                for e in early.into_iter().chain(sources_early) {
                    keep_name(
                        &mut self.early_names,
                        e,
                        &mut self.emit.stats.early_names_forgotten,
                    );
                }
                if let Some(r) = returning {
                    self.end_record(r, Names::Older);
                }
                self.streams.disown_ssrc(key.ssrc, key.source);
                return Err(DropReason::StreamLimit);
            }
        }
        self.serial += 1;
        let assume_start = self.cfg.compat == Compat::T140llm;
        let mut stream = Stream::new(key, self.serial, now, self.red_format(), assume_start);
        if let Some(&ms) = self.ended.get(&key)
            && ms >= now.as_millis()
        {
            stream.created = Time::from_millis(ms + 1);
        }
        if let Some(r) = returning {
            stream.register.resume(r.at);
            stream.last_packet = r.last_packet;
            stream.mixer = r.mixer;
            stream.unplaced_at = r.unplaced_at;
            // Its speakers go on as they were (README "Stream limit"): what a last packet left
            // unfinished, where a mixer's source's redundancy was placed to, the mapping's
            // decision, the names, unless an SDES of a rank as high came meanwhile (its own
            // voice's is `early`, below).
            stream.speakers = r.speakers;
            stream.own = (stream.speakers.iter())
                .position(|sp| sp.voice == Voice::Ssrc)
                .map_or(NO_SPEAKER, |i| i as u8);
            for e in sources_early {
                if let Some(sp) =
                    (stream.speakers.iter_mut()).find(|sp| sp.voice == Voice::Csrc(e.id))
                {
                    e.name(sp);
                }
            }
        }
        // An SDES that arrived before the first RTP packet names the participant in its join.
        if let Some(e) = early {
            let (idx, _) = stream.speaker(VoiceRef::Ssrc, now);
            e.name(&mut stream.speakers[idx]);
        }
        let slot = self.slots.insert(stream);
        self.index.insert(key, slot);
        debug_assert_eq!(self.streams.held(), self.index.len());
        if self.silent.len() + self.spared.len() + self.unspared.len() > 2 * self.index.len() + 64 {
            self.prune_silent();
        }
        self.silent.push_back((slot, self.serial));
        self.emit.stats.streams_total += 1;
        self.emit.stats.streams_live += 1;
        // Debug, not info: a flood of random SSRCs must not become a flood of log lines.
        tracing::debug!(source = %key.source, ssrc = format_args!("{:08x}", key.ssrc), "stream started");
        // Its timer is armed by the packet that opened it, as by every packet.
        Ok(slot)
    }

    /// Forgets the `silent` entries of streams that ended or carried text (neither can be
    /// evicted again), so that streams coming and going below the limit leave nothing behind.
    /// Called when the queue is twice the live streams: amortised O(1) a stream.
    #[cold]
    #[inline(never)]
    fn prune_silent(&mut self) {
        let slots = &self.slots;
        let candidate = |&(slot, serial): &(u32, u64)| {
            slots
                .get(slot)
                .is_some_and(|s| s.serial == serial && !spoke(s))
        };
        self.silent.retain(candidate);
        self.spared.retain(candidate);
        self.unspared
            .retain(|&Reverse((serial, slot))| candidate(&(slot, serial)));
    }

    /// At the stream limit, makes room by removing the oldest stream that holds no text and
    /// never joined (never carried text), without a trace on the PVP side: a flood of random
    /// SSRCs cannot lock out a real speaker. What it needs to come back unharmed is kept
    /// ([`Gateway::remember_evicted`]). A stream that may yet speak ([`may_yet_speak`]:
    /// text behind a gap; for a reorder wait after its last packet, a restart's run, part of a
    /// character, an escape sequence begun) is spared: it goes to `spared`, walked at most
    /// every [`SILENT_WALK_PAUSE`], and those a walk finds sparing themselves no longer take
    /// their turn again by age (`unspared`).
    /// Amortised O(1) a stream, but for the walks of `spared`: one in 50 ms.
    fn evict_silent_stream(&mut self, now: Time) -> bool {
        // The oldest candidate in creation order.
        let first = loop {
            let Some(&(slot, serial)) = self.silent.front() else {
                break None;
            };
            match self.candidate(slot, serial, now) {
                Candidate::Evictable => break Some((serial, slot)),
                Candidate::Gone => {}
                Candidate::Spared => self.spared.push_back((slot, serial)),
            }
            self.silent.pop_front();
        };
        if now >= self.spared_after && !self.spared.is_empty() {
            for _ in 0..self.spared.len() {
                let Some((slot, serial)) = self.spared.pop_front() else {
                    break;
                };
                match self.candidate(slot, serial, now) {
                    Candidate::Gone => {}
                    Candidate::Spared => self.spared.push_back((slot, serial)),
                    Candidate::Evictable => self.unspared.push(Reverse((serial, slot))),
                }
            }
            self.spared_after = now.saturating_add(SILENT_WALK_PAUSE);
        }
        // The oldest of those spared no longer.
        let unspared = loop {
            let Some(&Reverse((serial, slot))) = self.unspared.peek() else {
                break None;
            };
            match self.candidate(slot, serial, now) {
                Candidate::Evictable => break Some((serial, slot)),
                Candidate::Gone => {}
                Candidate::Spared => self.spared.push_back((slot, serial)),
            }
            self.unspared.pop();
        };
        let slot = match (first, unspared) {
            (Some(a), Some(b)) if b.0 < a.0 => {
                self.unspared.pop();
                b.1
            }
            (Some(a), _) => {
                self.silent.pop_front();
                a.1
            }
            (None, Some(b)) => {
                self.unspared.pop();
                b.1
            }
            (None, None) => return false,
        };
        self.evict(slot);
        true
    }

    fn candidate(&self, slot: u32, serial: u64, now: Time) -> Candidate {
        match self.slots.get(slot).filter(|s| s.serial == serial) {
            None => Candidate::Gone,
            Some(s) if spoke(s) => Candidate::Gone,
            // Words held until the idle flush: they join it, or a backspace erased them.
            Some(s) if holds_words(s) || may_yet_speak(s, now, self.cfg.reorder_wait) => {
                Candidate::Spared
            }
            Some(_) => Candidate::Evictable,
        }
    }

    /// Removes the live stream in `slot` to make room ([`Gateway::evict_silent_stream`]): its
    /// speakers go with its record for its return, or, with none kept, end with it (what they
    /// left unfinished counted, as at any stream's end); nothing it held is said.
    fn evict(&mut self, slot: u32) {
        let mut s = self.slots.remove(slot).expect("live");
        // Before its restart's run is dropped: a stream holding one keeps no record.
        self.remember_evicted(&mut s);
        s.register.drop_jumped();
        // A stream lingering after its BYE hands on no name: the source's session ended, and
        // a name that came since is the next session's (README "RTCP"; review, session 36).
        let names = if s.bye_waits {
            Names::Forget
        } else {
            Names::Newest
        };
        self.end_speakers(s.key, std::mem::take(&mut s.speakers), names);
        // Unless its record took them ([`Gateway::remember_evicted`]), as at a stream's end.
        self.emit.stats.idle_tail += s.mixer.let_go_unplaced();
        self.timers.remove(slot);
        self.index.remove(&s.key);
        self.streams.release();
        self.streams.disown_ssrc(s.key.ssrc, s.key.source);
        self.emit.stats.streams_live -= 1;
        self.emit.stats.evicted += 1;
        self.emit.stats.harvest(&mut s.register);
    }

    /// A decoder whose stream is gone: what it left unfinished is counted (nothing is said).
    fn end_decoder(&mut self, mut d: Decoder) {
        d.finish(&mut String::new(), &mut self.emit.said.decode);
    }

    /// Ends the records of evicted streams that would have timed out by `now`, as the timers
    /// run: one comparison, with the earliest end (`evicted_until`; records end in no set
    /// order, each at its own last packet's timeout).
    fn expire_evicted(&mut self, now: Time) {
        if now >= self.evicted_until {
            self.end_evicted(|e| e.until <= now, Names::Older);
        }
    }

    /// Ends the records of evicted streams that `gone` picks, without their return: what
    /// each one's decoder left unfinished is counted.
    fn end_evicted(&mut self, gone: impl Fn(&Evicted) -> bool, names: Names) {
        let mut until = Time::NEVER;
        for e in std::mem::take(&mut self.evicted) {
            if gone(&e) {
                self.end_record(e, names);
            } else {
                until = until.min(e.until);
                self.evicted.push_back(e);
            }
        }
        self.evicted_until = until;
    }

    /// What an evicted stream needs if its source comes back (a caller that opened with the
    /// BOM and has not typed yet is the oldest silent stream when a flood comes): where its
    /// numbering stood, so that its next packet is not taken for a stream whose head was lost
    /// (a wait, and a false U+FFFD, RFC 4103 5.3), and its speakers as they were (decoders,
    /// redundancy placed, mapping, names). Not for a stream whose source said BYE: what
    /// follows is its next session's (nor kept past a BYE that comes after,
    /// [`Gateway::forget_evicted`]). When the record ends its names outlive it, as any early
    /// name ([`Gateway::end_speakers`], README "Stream limit").
    #[cold]
    #[inline(never)]
    fn remember_evicted(&mut self, s: &mut Stream) {
        if s.bye_waits {
            return;
        }
        // A loss mark it holds (a lost head's) is not forgotten: without a position, a stream
        // coming back waits for its head and marks it again.
        let marked = s.speakers.iter().any(|sp| !sp.chunker.is_blank());
        let at = s.register.position().filter(|_| !marked);
        // Its speakers go with the record as they are, so that neither the numbering
        // continued nor a speaker made again feeds a voice what it already had. Without a
        // position (a lost head's mark, a restart's run kept) nothing is kept: the stream
        // coming back takes its first packet's generations afresh (README "Stream limit").
        if let Some(at) = at {
            if self.evicted.len() == EVICTED_KEPT
                && let Some(old) = self.evicted.pop_front()
            {
                self.end_record(old, Names::Older);
            }
            let until = s.last_packet.plus_us(self.delays.stream_timeout);
            self.evicted_until = self.evicted_until.min(until);
            self.evicted.push_back(Evicted {
                key: s.key,
                until,
                at,
                last_packet: s.last_packet,
                speakers: std::mem::take(&mut s.speakers),
                mixer: std::mem::take(&mut s.mixer),
                unplaced_at: s.unplaced_at,
            });
        }
    }

    /// The speakers of a stream gone without a word (evicted, or its record ended): what
    /// each left unfinished is counted, and their SDES names go among the early names, so
    /// that a stream of the same source takes them for its join (README "Stream limit").
    #[cold]
    #[inline(never)]
    fn end_speakers(&mut self, key: StreamKey, speakers: Speakers, names: Names) {
        for mut sp in speakers {
            self.end_decoder(std::mem::take(&mut sp.decoder));
            let (id, via) = match sp.voice {
                _ if sp.profile.name_rank == 0 || names == Names::Forget => continue,
                Voice::Ssrc => (key.ssrc, None),
                Voice::Csrc(c) => (c, Some(key)),
                Voice::Named(_) => continue,
            };
            let name = EarlyName {
                ip: key.source.ip(),
                id,
                name: std::mem::take(&mut sp.profile.name),
                rank: sp.profile.name_rank,
                via,
            };
            // A record's name is older than any SDES that came while it was kept; that one
            // is its mixer's source's still (forgotten with the mixer's BYE).
            if names == Names::Older
                && let Some(e) =
                    (self.early_names.iter_mut()).find(|e| e.of(name.ip, id) && e.rank >= name.rank)
            {
                e.via = e.via.or(via);
                continue;
            }
            keep_name(
                &mut self.early_names,
                name,
                &mut self.emit.stats.early_names_forgotten,
            );
        }
    }

    /// Where the numbering of an evicted stream of `key` stood ([`Gateway::remember_evicted`]),
    /// if it comes back before it would have timed out.
    #[cold]
    fn returning(&mut self, key: &StreamKey, now: Time) -> Option<Evicted> {
        let i = self.evicted.iter().position(|e| e.key == *key)?;
        let e = self.evicted.remove(i)?;
        if now < e.until {
            return Some(e);
        }
        self.end_record(e, Names::Older);
        None
    }

    /// An eviction record ending without its stream's return: what its speakers left
    /// unfinished is counted, as at any stream's end, and their names outlive it.
    fn end_record(&mut self, mut e: Evicted, names: Names) {
        self.end_speakers(e.key, e.speakers, names);
        self.emit.stats.idle_tail += e.mixer.let_go_unplaced();
    }

    /// The evicted stream ([`Gateway::remember_evicted`]) of `ssrc` an RTCP packet from `source`
    /// is for, as [`Gateway::rtcp_stream`] finds a live one: from the same address (rtcp-mux,
    /// RFC 5761) or the port below (RFC 3550 11). Not any port of the host: its SSRC was freed
    /// at the eviction, and another stream of the host may hold it now.
    fn evicted_mixer(&self, source: SocketAddr, ssrc: u32) -> Option<StreamKey> {
        (self.evicted.iter())
            .map(|e| e.key)
            .find(|k| rtcp_from(k, source, ssrc))
    }

    /// A BYE for `ssrc` from `source` that ends no stream nor speaker: a stream of it evicted
    /// ([`Gateway::remember_evicted`]) ended its session (RFC 3550 6.6), so what was kept for
    /// its return, where its numbering stood and its SDES names (a mixer's sources' too, which
    /// end with it, README "RTCP"), is not its next session's (which starts afresh, as after a
    /// BYE that finds its stream, RFC 3550 5.1). Its stream is the one of the BYE's address or
    /// the port below, as a live stream's RTCP is found ([`Gateway::rtcp_stream`]); any of the
    /// host only when none is (RTCP from an unrelated port, RFC 3550 8.2): another stream of
    /// the host may have taken the SSRC freed at the eviction, and its record is not ended
    /// (review, session 36). `sender`: the compound's first SSRC, whose record holds the
    /// speaker a mixer's source's BYE ends.
    #[cold]
    #[inline(never)]
    fn forget_evicted(&mut self, source: SocketAddr, ssrc: u32, sender: Option<u32>) {
        let ip = source.ip();
        let at_address = |k: &StreamKey| rtcp_from(k, source, ssrc);
        let addressed = (self.evicted.iter()).any(|e| at_address(&e.key))
            || (self.early_names.iter()).any(|e| e.via.as_ref().is_some_and(at_address));
        // The host's other ports only for the compound's sender, as a live stream's RTCP is
        // found ([`Gateway::rtcp_stream_of_host`]): a mixer's BYE for its source's CSRC is not
        // another port's stream's that holds that SSRC (review, session 37).
        let host_wide = sender == Some(ssrc);
        let ended = |k: &StreamKey| {
            if addressed {
                at_address(k)
            } else {
                host_wide && k.ssrc == ssrc && k.source.ip() == ip
            }
        };
        self.end_evicted(|e| ended(&e.key), Names::Forget);
        // A mixer's source: its speaker in the mixer's record is its ended session's (the
        // record holds no packet for it: it has no run nor held packets). The record of the
        // compound's mixer, else any of the host's.
        let mixer = (sender.filter(|&m| m != ssrc)).and_then(|m| self.evicted_mixer(source, m));
        let mut gone = Vec::new();
        for e in self.evicted.iter_mut().filter(|e| match mixer {
            Some(m) => e.key == m,
            None => e.key.source.ip() == ip,
        }) {
            while let Some(i) = e.speakers.iter().position(|v| v.voice == Voice::Csrc(ssrc)) {
                gone.push(e.speakers.remove(i).decoder);
            }
        }
        for d in gone {
            self.end_decoder(d);
        }
        (self.early_names).retain(|e| !(e.of(ip, ssrc) || e.via.as_ref().is_some_and(ended)));
    }

    /// RTCP (RFC 3550 6): SDES NAME (else CNAME) names the participant, BYE ends the stream.
    /// It may come from the RTP port (rtcp-mux, RFC 5761) or the next one up (RFC 3550 11).
    /// `counts`: this worker counts the datagram's anomalies (others act on it too).
    fn receive_rtcp(
        &mut self,
        now: Time,
        source: SocketAddr,
        data: &[u8],
        counts: bool,
    ) -> Result<(), DropReason> {
        let source = canonical(source);
        // Every event of the compound, however many: a mixer's SDES has a chunk for each of its
        // sources, and the BYE comes last (RFC 3550 6.1). The datagram bounds them.
        let mut events: smallvec::SmallVec<[RtcpEvent<'_>; 8]> = smallvec::SmallVec::new();
        let ok = crate::rtcp::parse(data, &mut |e| events.push(e));
        // Names first, one per source: the best item of the whole compound (NAME, else CNAME),
        // so an SDES carrying both announces once. An item that leaves no name (all controls)
        // is passed over, so the CNAME still names (README "RTCP"; review, session 36). Then BYEs.
        let mut best: smallvec::SmallVec<[(u32, &str, u8); 4]> = smallvec::SmallVec::new();
        let mut too_many = false;
        for e in &events {
            let (ssrc, name, rank) = match *e {
                RtcpEvent::Name { ssrc, name } => (ssrc, name, 2),
                RtcpEvent::Cname { ssrc, cname } => (ssrc, cname, 1),
                RtcpEvent::NotUtf8 { .. } => {
                    self.emit.stats.sdes_not_utf8 += u64::from(counts);
                    continue;
                }
                RtcpEvent::Bye { .. } | RtcpEvent::Report { .. } => continue,
            };
            if sdes_item(name).is_none() {
                continue;
            }
            let full = best.len() == MAX_RTCP_SOURCES;
            match best.iter_mut().find(|b| b.0 == ssrc) {
                Some(b) if b.2 < rank => *b = (ssrc, name, rank),
                Some(_) => {}
                None if full => {
                    // No look through the full list for every later item: a better item for
                    // a source already listed that comes after this is passed over too.
                    too_many = true;
                    break;
                }
                None => best.push((ssrc, name, rank)),
            }
        }
        // The compound's own stream: the first of its sources that is one (a mixer's, whose
        // CNAME every compound carries, RFC 3550 6.1). A mixer forwards its sources' SDES and
        // BYE with their CSRCs as the SSRC (RFC 3550 6.5, 6.6, 7.3): those name, or end, that
        // stream's speakers of those CSRCs.
        let sender = events.first().map(rtcp_ssrc);
        // Names or ends something: a report alone does neither.
        let acts = (events.iter())
            .any(|e| !matches!(e, RtcpEvent::Report { .. } | RtcpEvent::NotUtf8 { .. }));
        let says_bye = (events.iter()).any(|e| matches!(e, RtcpEvent::Bye { .. }));
        let home = (events.iter())
            .find_map(|e| self.rtcp_stream(source, rtcp_ssrc(e)))
            .or_else(|| self.rtcp_stream_of_host(source, sender?, sender));
        // Names for a waiting mixer's sources are kept for its next session's speakers.
        let named_home = home.filter(|&h| self.takes_names(h));
        for (ssrc, name, rank) in best {
            let mixed = match (self.rtcp_stream(source, ssrc), named_home) {
                (None, Some(h)) => self.csrc_speaker(h, ssrc).map(|i| (h, i)),
                _ => None,
            };
            match mixed {
                Some((h, i)) => self.name_speaker(now, h, i, name, rank),
                None => {
                    let slot = (self.rtcp_stream(source, ssrc))
                        .or_else(|| self.rtcp_stream_of_host(source, ssrc, sender));
                    // A source of the compound's mixer, live or evicted from this address: its
                    // name is the mixer's session's, forgotten with the mixer's BYE (review,
                    // session 36: a live mixer's, never evicted, outlived it).
                    let mixer = sender.filter(|&m| m != ssrc);
                    // Only a stream known as a mixer (a source of it heard): a plain
                    // endpoint's compound may name its own next SSRC, which its first
                    // stream's BYE does not end (RFC 3550 6.6; review, session 37).
                    let live = (named_home.and_then(|h| self.slots.get(h)))
                        .filter(|s| {
                            (s.speakers.iter()).any(|sp| matches!(sp.voice, Voice::Csrc(_)))
                        })
                        .map(|s| s.key);
                    let via = (live.filter(|k| Some(k.ssrc) == mixer))
                        .or_else(|| self.evicted_mixer(source, mixer?));
                    self.name_stream(now, source, ssrc, slot, name, rank, via);
                }
            }
        }
        // Streams' own BYEs first, then their sources': a mixer shutting down lists both in one
        // BYE (RFC 3550 6.6), in no set order, and its sources then leave with its stream.
        let mut sources: smallvec::SmallVec<[u32; 8]> = smallvec::SmallVec::new();
        for e in events {
            let RtcpEvent::Bye { ssrc } = e else { continue };
            // A stream of the host from another port, unless the compound's mixer has a
            // source of that CSRC: it is the mixer's to end.
            let own = self.rtcp_stream(source, ssrc).or_else(|| {
                let mixers = home.is_some_and(|h| self.csrc_speaker(h, ssrc).is_some());
                (!mixers).then(|| self.rtcp_stream_of_host(source, ssrc, sender))?
            });
            match own {
                Some(slot) => self.stream_bye(now, slot),
                None if sources.len() == MAX_RTCP_SOURCES => too_many = true,
                None => sources.push(ssrc),
            }
        }
        for ssrc in sources {
            let speaker = home.and_then(|h| {
                let i = (self.csrc_speaker(h, ssrc)).or_else(|| self.unheard_source(now, h, ssrc));
                Some((h, i?))
            });
            match speaker {
                Some((h, i)) => self.end_speaker(now, h, i, "rtcp bye"),
                None => self.forget_evicted(source, ssrc, sender),
            }
        }
        if home.is_none() && acts {
            self.keep_for_other_workers(source, data, false);
        } else if home.is_some() && says_bye {
            // The other workers forget what they kept for it (names handed on before the
            // stream's first packet).
            self.keep_for_other_workers(source, data, true);
        }
        if !ok {
            Err(DropReason::RtcpMalformed)
        } else if too_many {
            Err(DropReason::RtcpTooManySources)
        } else {
            Ok(())
        }
    }

    /// RTCP that names or ends no stream of this core, or (`ended`) whose BYE ended one here,
    /// kept for the other workers when shared ([`Gateway::share_rtcp`]).
    #[cold]
    #[inline(never)]
    fn keep_for_other_workers(&mut self, source: SocketAddr, data: &[u8], ended: bool) {
        if let Some(kept) = &mut self.shared_rtcp {
            let data = data.to_vec();
            kept.push((source, HandedRtcp { data, ended }));
        }
    }

    /// The stream an RTCP packet from `source` about `ssrc` is for: the one from the same
    /// address (rtcp-mux, RFC 5761), or from the port below (RFC 3550 11).
    fn rtcp_stream(&self, source: SocketAddr, ssrc: u32) -> Option<u32> {
        let mut rtp = source;
        let by_mux = self.index.get(&StreamKey { source, ssrc });
        rtp.set_port(source.port().wrapping_sub(1));
        by_mux.or_else(|| self.index.get(&StreamKey { source: rtp, ssrc }))
    }

    /// The SSRC's stream from `source`'s host, whatever its port, when [`Gateway::rtcp_stream`]
    /// finds none: RFC 3550 8.2 keeps RTP's and RTCP's source addresses apart, and a sender
    /// with two sockets (or behind a NAT) sends RTCP from a port unrelated to its RTP's. Asked
    /// after a mixer's sources: a CSRC the compound's mixer has is its, not another stream's.
    /// Only for the compound's `sender` (its first SSRC, RFC 3550 6.1), never for an SSRC it
    /// reports for others: a mixer forwards its sources' CSRCs, and a worker that does not
    /// hold the mixer's stream cannot tell them from the host's own SSRCs.
    fn rtcp_stream_of_host(
        &self,
        source: SocketAddr,
        ssrc: u32,
        sender: Option<u32>,
    ) -> Option<u32> {
        if sender != Some(ssrc) {
            return None;
        }
        let owner = self.streams.owner(ssrc)?;
        let host = owner.ip() == source.ip();
        host.then(|| {
            self.index.get(&StreamKey {
                source: owner,
                ssrc,
            })
        })?
    }

    /// A speaker for source `csrc` of mixer stream `slot`, which a BYE names before any of its
    /// packets came: the BYE may have overtaken the source's only packets (RFC 3550 6.3.7; the
    /// mixer forwards it in RTCP, apart from its RTP). Made now, not yet joined (it joins at
    /// its first text), so that its leave waits as any source's does ([`Gateway::end_speaker`]):
    /// its words sent before the BYE are its last, and then it leaves; words sent after it
    /// join it again. A source that never speaks leaves unseen. Only in a stream that carries
    /// mixer sources, whose BYE does not wait, with fewer than [`MAX_UNHEARD`] such speakers
    /// not heard since, and while the stream has room for more than half its speakers (BYEs
    /// for members that never speak must not take the places of sources to come, nor, at the
    /// limit, map to the stream's own voice).
    #[cold]
    #[inline(never)]
    fn unheard_source(&mut self, now: Time, slot: u32, csrc: u32) -> Option<usize> {
        // t140llm sends no RTCP, and its CSRC multiplexing marks a loss only where the stream
        // has one voice: a speaker made by a BYE would count as a second.
        if self.cfg.compat == Compat::T140llm {
            return None;
        }
        let wait = !self.cfg.reorder_wait.is_zero();
        let s = self.slots.get_mut(slot)?;
        let csrc_voice = |sp: &Speaker| matches!(sp.voice, Voice::Csrc(_));
        // Not heard (yet): speakers are never removed, so these keep their places.
        let unheard = (s.speakers.iter())
            .filter(|sp| csrc_voice(sp) && !sp.joined && sp.last_ts.is_none())
            .count();
        // With no leave to wait (no reorder wait, or no packet placed to tell the mixer's
        // clock by), the source would leave at once: nothing to make it for.
        if !wait
            || !s.speakers.iter().any(csrc_voice)
            || s.bye_waits
            || unheard >= MAX_UNHEARD
            || s.speakers.len() >= crate::stream::MAX_SPEAKERS / 2
            || bye_sent_by(&s.register, &s.speakers, now).is_none()
        {
            return None;
        }
        let Stream {
            speakers, own, key, ..
        } = s;
        let i = speaker_index(speakers, own, key, VoiceRef::Csrc(csrc), now);
        name_new_speaker(&mut self.early_names, key, csrc, &mut speakers[i]);
        Some(i)
    }

    /// The speaker of stream `slot` whose voice is CSRC `csrc` (a mixer's source), if any.
    fn csrc_speaker(&self, slot: u32, csrc: u32) -> Option<usize> {
        let s = self.slots.get(slot)?;
        s.speakers
            .iter()
            .position(|sp| sp.voice.as_ref() == VoiceRef::Csrc(csrc))
    }

    /// A mixer's source named in the mixer's SDES: as [`Gateway::name_stream`] for a stream's
    /// own voice.
    fn name_speaker(&mut self, now: Time, slot: u32, i: usize, name: &str, rank: u8) {
        let Some(name) = sdes_item(name) else { return };
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        let Stream { speakers, key, .. } = s;
        self.emit.rename(now, key, &mut speakers[i], name, rank);
    }

    /// A mixer's source that left (a BYE for its CSRC): what it said goes out, then its leave;
    /// the mixer's stream and its other speakers go on. What it said includes its packets
    /// sent before the BYE that have not been delivered: held behind a gap in the mixer's
    /// sequence, or still on their way (the mixer forwards the BYE in its RTCP, which travels
    /// apart from its RTP and may overtake it: RFC 3550 6.3.7 keeps a source a while after its
    /// BYE for such packets). So the leave waits ([`Bye`]): until the stream delivers a packet
    /// stamped after the moment the BYE was sent, or else for the reorder wait (RFC 4103 5.4),
    /// and it is stamped then. A packet of the source stamped after the BYE was said after it:
    /// the leave comes first, and the source joins again.
    fn end_speaker(&mut self, now: Time, slot: u32, i: usize, reason: &str) {
        let wait = self.cfg.reorder_wait;
        let Some(s) = self.slots.get_mut(slot).filter(|s| !s.bye_waits) else {
            // The mixer itself said BYE (a mixer shutting down lists its sources with its own
            // SSRC, RFC 3550 6.6): its stream lingers for late packets, and every speaker
            // leaves when it ends.
            return;
        };
        let Stream {
            register,
            speakers,
            mixer,
            key,
            created,
            ..
        } = s;
        let sent_by = (!wait.is_zero())
            .then(|| bye_sent_by(register, speakers, now))
            .flatten();
        let sp = &mut speakers[i];
        let Some(ts) = sent_by else {
            // No reorder wait, or the stream never placed a packet: nothing to wait for.
            forget_byes(sp, mixer);
            self.emit.speaker_ends(now, key, created, sp, reason);
            mixer.spoke |= sp.joined;
            sp.joined = false;
            return;
        };
        let bye = Bye {
            ts,
            by: now.saturating_add(wait),
        };
        let m = sp.profile.mixer();
        if m.bye_at.is_none() {
            m.bye_at = Some(bye);
            mixer.byes = mixer.byes.saturating_add(1);
        } else {
            // A second BYE before the first's leave: the source spoke again in between, or
            // the BYE was repeated (then the second leave finds it gone, and says nothing).
            m.bye_then = Some(bye);
        }
        register.set_leave_waits(true);
        self.arm(now, slot);
    }

    /// The mixer sources whose leave waited out the reorder wait from their BYE ([`Bye::by`])
    /// by `now`, with nothing they may have sent before it still held, leave now, in the order
    /// of their waits' ends. A source whose wait ended while such a packet was held leaves
    /// once it is delivered.
    #[cold]
    #[inline(never)]
    fn settle_byes(&mut self, now: Time, slot: u32) {
        let compat = self.cfg.compat;
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        let (register, mut voices) = Voices::of(s, compat);
        loop {
            let due = (voices.speakers.iter().enumerate())
                .filter_map(|(idx, sp)| Some((sp.profile.bye_at()?, idx)))
                .filter(|(b, _)| b.by <= now && !register.holds_up_to(b.ts))
                .map(|(b, idx)| (b.by, idx))
                .min();
            let Some((_, idx)) = due else { break };
            mixer_source_leaves(&mut self.emit, &mut voices, now, idx);
        }
        register.set_leave_waits(voices.mixer.byes > 0);
    }

    /// The leaves of mixer sources due by `until` ([`first_bye_end`]), each at its own time,
    /// in time order: the stream's timer work due by then first ([`Gateway::flush_and_expire`],
    /// idle flushes up to `idle_until`), then the leave. So a call later than the leaves (a
    /// stalled driver, a stream timeout long after) still says each leave as of its wait's
    /// end, after what came before it and before what came after.
    #[cold]
    #[inline(never)]
    fn byes_due_by(&mut self, until: Time, slot: u32, idle_until: Time) {
        // Each pass ends a leave or stops: at most two BYEs wait for each speaker.
        for _ in 0..=2 * crate::stream::MAX_SPEAKERS {
            let Some(s) = self.slots.get(slot) else {
                return;
            };
            let by = first_bye_end(&s.register, &s.speakers);
            if by > until {
                return;
            }
            self.flush_and_expire(by, slot, by.min(idle_until));
            self.settle_byes(by, slot);
        }
    }

    /// Whether SDES names go to stream `slot`. Not when its BYE waits: it has ended but for
    /// late packets, and a name after its BYE is its source's next session's, kept (in
    /// `early_names`) for that stream's join.
    fn takes_names(&self, slot: u32) -> bool {
        self.slots.get(slot).is_some_and(|s| !s.bye_waits)
    }

    /// `rank` 2 for NAME, 1 for CNAME: a NAME is never replaced by a CNAME.
    /// `slot`: the stream the compound names ([`Gateway::rtcp_stream`], or the host's for the
    /// compound's sender), if any.
    /// `via`: the evicted mixer whose source `ssrc` is ([`EarlyName::via`]).
    #[allow(clippy::too_many_arguments)]
    fn name_stream(
        &mut self,
        now: Time,
        source: SocketAddr,
        ssrc: u32,
        slot: Option<u32>,
        name: &str,
        rank: u8,
        via: Option<StreamKey>,
    ) {
        let Some(name) = sdes_item(name) else { return };
        let Some(slot) = slot.filter(|&s| self.takes_names(s)) else {
            keep_name(
                &mut self.early_names,
                EarlyName {
                    ip: source.ip(),
                    id: ssrc,
                    name: name.to_owned(),
                    rank,
                    via,
                },
                &mut self.emit.stats.early_names_forgotten,
            );
            return;
        };
        let s = self.slots.get_mut(slot).expect("live");
        let Stream {
            speakers, own, key, ..
        } = s;
        let idx = speaker_index(speakers, own, key, VoiceRef::Ssrc, now);
        self.emit.rename(now, key, &mut speakers[idx], name, rank);
    }

    /// The earliest moment this stream needs attention.
    fn deadline(&self, s: &Stream) -> Time {
        let at = self.stream_deadline(s);
        if s.mixer.byes > 0 {
            return at.min(first_bye_end(&s.register, &s.speakers));
        }
        at
    }

    /// [`Gateway::deadline`] but for mixer sources' leaves.
    #[inline(always)]
    fn stream_deadline(&self, s: &Stream) -> Time {
        match s.register.deadline(self.cfg.reorder_wait) {
            // Packets waiting behind a gap: the speaker is not silent, so no idle flush
            // until the gap is settled.
            Some(gap) => gap.min(s.last_packet.plus_us(self.delays.stream_timeout)),
            None if s.bye_waits => self.lingering_deadline(s),
            None => self
                .delays
                .without_gap(s.last_packet, &s.speakers, Time::NEVER),
        }
    }

    /// [`Gateway::deadline`] of a stream lingering after its source's BYE with nothing held
    /// ([`Gateway::stream_bye`]): its idle flush or the wait's end, whichever is first.
    #[cold]
    #[inline(never)]
    fn lingering_deadline(&self, s: &Stream) -> Time {
        let at = self
            .delays
            .without_gap(s.last_packet, &s.speakers, Time::NEVER);
        s.register
            .bye_deadline(self.cfg.reorder_wait)
            .map_or(at, |bye| at.min(bye))
    }

    /// After a packet of a stream whose source's BYE waits: the stream ends if the wait is
    /// over, else its timer is armed for `due` or the wait's end, if sooner.
    #[cold]
    #[inline(never)]
    fn after_bye_packet(&mut self, now: Time, slot: u32, due: Time) {
        let register = &self.slots.get(slot).expect("live").register;
        match register.bye_deadline(self.cfg.reorder_wait) {
            Some(end) if end <= now => self.close_stream(now, slot, "rtcp bye"),
            end => self.arm_after_packet(now, slot, end.map_or(due, |end| due.min(end))),
        }
    }

    /// Records the stream's deadline after a packet at `now` (with nothing held, the lower
    /// bound of [`Delays::without_gap`]), so that a lazy timer entry can be re-armed from the
    /// timer table without reading the stream.
    #[inline]
    fn arm_after_packet(&mut self, now: Time, slot: u32, due: Time) {
        self.timers.set(slot, due, now);
        if due <= now {
            // A packet that closes a gap can leave an idle flush the gap held back overdue:
            // it fires now, as the timers due before the packet did, so no timer is left
            // behind the clock (`poll_timeout` stays ahead of `now`).
            self.fire_due_from(now);
        }
    }

    /// Fires every timer due by `now`, each at its own deadline (in time order), so envelope
    /// timestamps are those of the deadlines, not of when the gateway noticed them. The test
    /// is inline; the firing, rare per packet, is not, so it stays out of the packet path.
    #[inline]
    fn fire_due(&mut self, now: Time) {
        // The timers only: an eviction record's end waits for them or for `handle_timeout`
        // (one comparison less a packet).
        if self.timers.next().is_some_and(|t| t <= now) {
            self.fire_due_from(now);
        }
    }

    #[inline(never)]
    fn fire_due_from(&mut self, now: Time) {
        while let Some(t) = self.poll_timeout().filter(|&t| t <= now) {
            self.handle_timeout(t);
        }
    }

    fn arm(&mut self, now: Time, slot: u32) {
        let at = self.deadline(self.slots.get(slot).expect("live"));
        self.timers.set(slot, at, now);
    }

    /// Fires every timer due at `now`: reorder waits, idle flushes and stream timeouts.
    pub fn handle_timeout(&mut self, now: Time) {
        self.expire_evicted(now);
        while let Some((at, slot)) = self.timers.pop_due(now) {
            let Some(s) = self.slots.get(slot) else {
                continue;
            };
            // The recorded deadline may be earlier than the real one (a chunk sent on a
            // sentence end leaves no idle flush): put the entry back at the real time, so
            // streams are handled in time order (envelope timestamps never go backwards when a
            // late call catches up on many at once).
            let real = self.deadline(s);
            if real > at {
                self.timers.set(slot, real, now);
                continue;
            }
            let s = self.slots.get_mut(slot).expect("live");
            if s.bye_waits {
                self.lingering_timeout(at, slot);
                continue;
            }
            let timeout_at = s.last_packet.plus_us(self.delays.stream_timeout);
            if timeout_at <= at {
                if s.mixer.byes > 0 {
                    self.byes_due_by(at, slot, at);
                }
                self.close_stream(at, slot, "stream timeout");
                continue;
            }
            // As of the deadline, not `now`: on a late call the work due before `now` (an idle
            // flush, a gap's wait, the timeout) is done as of its own time, and the stream's
            // next deadline comes round again in this loop, in time order with the others'.
            self.fire_stream(at, slot, Time::NEVER);
        }
    }

    /// A timer of a stream whose source's BYE waits ([`Gateway::stream_bye`]): as any other
    /// stream's, but it ends at the end of the wait from the BYE (or its stream timeout, if
    /// sooner), stamped then however late this call, and an idle flush due after that end is
    /// the end's flush.
    #[cold]
    #[inline(never)]
    fn lingering_timeout(&mut self, at: Time, slot: u32) {
        let Some(s) = self.slots.get(slot) else {
            return;
        };
        let timeout_at = s.last_packet.plus_us(self.delays.stream_timeout);
        let bye_end = (s.register.bye_deadline(self.cfg.reorder_wait)).unwrap_or(timeout_at);
        let end = bye_end.min(timeout_at);
        if at < end {
            // As of the deadline, as [`Gateway::handle_timeout`]'s other streams: on a late
            // call the work due before the end (a gap's wait, an idle flush) is done as of its
            // own time, and the next deadline, the end at the latest, comes round again.
            self.fire_stream(at, slot, end);
            return;
        }
        // The wait is over: as of its end, the idle flushes due by then go out, each at its
        // own time, then the gaps held are given up and the stream ends.
        let end = end.max(at);
        if self.slots.get(slot).is_some_and(|s| s.mixer.byes > 0) {
            self.byes_due_by(end, slot, end);
        }
        self.flush_and_expire(end, slot, end);
        self.close_stream(end, slot, "rtcp bye");
    }

    /// A stream's timer work due by `now` ([`Gateway::flush_and_expire`]), then the mixer
    /// sources' BYEs that have come due, and its next deadline armed.
    #[inline(always)]
    fn fire_stream(&mut self, now: Time, slot: u32, idle_until: Time) {
        if self.slots.get(slot).is_some_and(|s| s.mixer.byes > 0) {
            return self.fire_stream_with_leaves(now, slot, idle_until);
        }
        self.flush_and_expire(now, slot, idle_until);
        self.arm(now, slot);
    }

    /// [`Gateway::fire_stream`] for a mixer's stream whose sources' leaves wait: those due by
    /// `now` first, each at its own time ([`Gateway::byes_due_by`]).
    #[cold]
    #[inline(never)]
    fn fire_stream_with_leaves(&mut self, now: Time, slot: u32, idle_until: Time) {
        self.byes_due_by(now, slot, idle_until);
        self.flush_and_expire(now, slot, idle_until);
        // Those whose packets held at their wait's end were delivered just now.
        self.settle_byes(now, slot);
        self.arm(now, slot);
    }

    /// The gaps whose reorder wait is over by `now` are given up (RFC 4103 5.4), and the
    /// speakers silent for the idle flush, by `idle_until` at the latest, flush what they hold.
    #[inline(always)]
    fn flush_and_expire(&mut self, now: Time, slot: u32, idle_until: Time) {
        let compat = self.cfg.compat;
        let s = self.slots.get_mut(slot).expect("live");
        let (register, mut voices) = Voices::of(s, compat);
        let emit = &mut self.emit;
        register.expire(now, self.cfg.reorder_wait, &mut |tag, piece| {
            route(emit, &mut voices, now, tag, piece)
        });
        let Voices {
            speakers,
            key,
            created,
            ..
        } = voices;
        let waiting = register.held() > 0;
        for sp in speakers.iter_mut() {
            let idle_at = sp.last_text.plus_us(self.delays.idle_flush);
            if !waiting && idle_at <= now && idle_at <= idle_until {
                self.emit.idle_flush(idle_at, key, created, sp);
            }
        }
        self.emit.stats.harvest(register);
    }

    /// Graceful stop: the timers due by `now` fire first (a late call's idle flushes at their
    /// own times), then every stream flushes what it holds and leaves, in creation order.
    pub fn shutdown(&mut self, now: Time) {
        self.handle_timeout(now);
        let mut live: Vec<(u64, u32)> = self
            .slots
            .iter()
            .map(|(slot, s)| (s.serial, slot))
            .collect();
        live.sort_unstable();
        for (_, slot) in live {
            self.close_stream(now, slot, "gateway shutdown");
        }
        self.timers.clear();
        self.end_evicted(|_| true, Names::Older);
        debug_assert_eq!(self.streams.held(), 0, "every stream gives back its room");
    }

    /// The stream's own source said BYE. Packets it sent before may still be on their way: a
    /// BYE travels apart from them and can overtake them (RFC 3550 6.3.7 keeps a member a while
    /// after its BYE for such packets; RTCP on its own port is read apart from RTP, too). So
    /// the stream lingers for the reorder wait (RFC 4103 5.4), taking the packets that fill its
    /// gaps or continue its numbering as any others, then ends: what it holds is given up,
    /// what it said goes out, and it leaves. A new session's packet ends it at once
    /// ([`Gateway::new_session_after_bye`]). The SSRC is free at once (RFC 3550 8.2): another
    /// sender may take it meanwhile. A mixer's sources' names it kept go at once.
    fn stream_bye(&mut self, now: Time, slot: u32) {
        let no_wait = self.cfg.reorder_wait.is_zero();
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        if s.bye_waits {
            // A BYE again: the first one's wait goes on.
            return;
        }
        // A mixer's session ends with its sources' (RFC 3550 6.6): the names that came
        // through it while it was evicted for sources it had not heard (its return took only
        // its speakers') go, as a BYE on its record forgets them ([`Gateway::forget_evicted`]).
        let key = s.key;
        (self.early_names).retain(|e| e.via != Some(key));
        if no_wait || !s.register.mark_bye(now) {
            self.close_stream(now, slot, "rtcp bye");
            return;
        }
        s.bye_waits = true;
        let serial = s.serial;
        self.streams.disown_ssrc(key.ssrc, key.source);
        if self.lingering.len() > 2 * self.index.len() + 64 {
            self.prune_lingering();
        }
        self.lingering.push_back((slot, serial));
        self.arm(now, slot);
    }

    /// Forgets the `lingering` entries of streams that ended since their BYE (their wait over,
    /// or a new session's packet): only [`Gateway::end_a_lingering_stream`], at the stream
    /// limit, pops the queue, and streams saying BYE below it must leave nothing behind either.
    /// Called when the queue is twice the live streams: amortised O(1) a BYE.
    #[cold]
    #[inline(never)]
    fn prune_lingering(&mut self) {
        let slots = &self.slots;
        self.lingering.retain(|&(slot, serial)| {
            slots
                .get(slot)
                .is_some_and(|s| s.serial == serial && s.bye_waits)
        });
    }

    /// At the stream limit with no silent stream to remove: ends the stream whose BYE came
    /// first and is still waiting for packets it may have overtaken, so that a new caller is
    /// not refused for a stream that has said goodbye. Amortised O(1), as
    /// [`Gateway::evict_silent_stream`].
    fn end_a_lingering_stream(&mut self, now: Time) -> bool {
        while let Some((slot, serial)) = self.lingering.pop_front() {
            if self
                .slots
                .get(slot)
                .is_some_and(|s| s.serial == serial && s.bye_waits)
            {
                self.close_stream(now, slot, "rtcp bye");
                return true;
            }
        }
        false
    }

    /// A packet for a stream whose BYE waits ([`Stream::bye_waits`]) that was not sent before
    /// the BYE ([`crate::register::Register::sent_before_bye`]; one that was is the stream's,
    /// and goes its usual way): the source's next session (RFC 3550 6.3.7). The old stream ends
    /// now, what it waited for given up, and the packet is received again, opening the new
    /// one; unless another source took the SSRC the BYE freed, and then it is refused and the
    /// old stream goes on waiting. The stream ends once the reorder wait from the BYE has
    /// passed ([`crate::register::Register::bye_deadline`]).
    #[cold]
    #[inline(never)]
    fn new_session_after_bye(
        &mut self,
        now: Time,
        slot: u32,
        source: SocketAddr,
        data: &[u8],
    ) -> Result<(), DropReason> {
        let own = self.slots.get(slot).expect("live").key;
        if self.streams.held_by_another(own.ssrc, own.source) {
            return Err(DropReason::SsrcConflict);
        }
        self.close_stream(now, slot, "rtcp bye");
        // Its key is gone from the index: this opens the new stream. What the packet's parse
        // counts was counted on the first pass.
        let stats = &self.emit.stats;
        let counted = (
            stats.red_newest_first,
            stats.red_block_pt_other,
            stats.metadata,
        );
        let received = self.receive(now, &source, data, None);
        let stats = &mut self.emit.stats;
        (
            stats.red_newest_first,
            stats.red_block_pt_other,
            stats.metadata,
        ) = counted;
        received
    }

    /// Ends a stream: held packets are given up, every speaker flushes and leaves.
    fn close_stream(&mut self, now: Time, slot: u32, reason: &str) {
        let compat = self.cfg.compat;
        let Some(mut s) = self.slots.remove(slot) else {
            return;
        };
        // A stream whose BYE waits was left by its source: a shutdown or timeout only cuts
        // the wait short.
        let reason = if s.bye_waits { "rtcp bye" } else { reason };
        self.timers.remove(slot);
        let (register, mut voices) = Voices::of(&mut s, compat);
        let emit = &mut self.emit;
        register.finish(&mut |tag, piece| route(emit, &mut voices, now, tag, piece));
        self.emit.stats.idle_tail += voices.mixer.let_go_unplaced();
        if voices.mixer.byes > 0 {
            // Mixer sources whose BYE waited for what was held: everything is out, and they
            // said BYE before the stream ended, so they leave first.
            byes_due(&mut self.emit, &mut voices, now, |_| true);
        }
        let Voices {
            speakers,
            key,
            created,
            ..
        } = voices;
        for sp in speakers.iter_mut() {
            self.emit.speaker_ends(now, key, created, sp, reason);
        }
        let keyed = newest_key_ms(speakers, *created);
        let key = *key;
        if self.ended.len() >= self.ended_cap {
            let now_ms = now.as_millis();
            self.ended.retain(|_, &mut ms| ms >= now_ms);
            self.ended_cap = (2 * self.ended.len()).max(ENDED_KEPT);
        }
        let ms = self.ended.entry(key).or_insert(keyed);
        *ms = (*ms).max(keyed);
        self.index.remove(&key);
        self.streams.release();
        debug_assert_eq!(self.streams.held(), self.index.len());
        self.streams.disown_ssrc(key.ssrc, key.source);
        self.emit.stats.streams_live -= 1;
        self.emit.stats.harvest(register);
        let (joined, count) = (speakers.iter().any(|sp| sp.joined), speakers.len());
        if joined {
            tracing::info!(
                source = %SourceText(&key.source),
                ssrc = %Hex8::new(key.ssrc),
                reason,
                packets = s.packets,
                speakers = count,
                "stream ended"
            );
        }
    }
}

/// Whether a t140llm packet's oldest redundant generation is its reply's first packet,
/// numbered and stamped 0 (docs/t140llm.md sections 3 and 5: generation `k` is the packet `k`
/// back, stamped back by its offset).
fn carries_reply_start(seq: u16, ts: u32, red: Option<&RedPayload<'_>>) -> bool {
    let Some(p) = red.filter(|p| p.redundant_count() > 0) else {
        return false;
    };
    let offset = p.redundant_blocks().map(|b| b.ts_offset).max().unwrap_or(0);
    seq.wrapping_sub(p.redundant_count() as u16) == 0 && ts.wrapping_sub(u32::from(offset)) == 0
}

/// Whether `data` is UTF-8 but for a character cut at either end (a conformant sender may split
/// one across packets, README "Text decoding"): up to 3 continuation bytes first, an
/// unfinished sequence last. Bytes that are not UTF-8 inside it are never t140llm's text.
fn utf8_inside(data: &[u8]) -> bool {
    let lead = data
        .iter()
        .take(3)
        .take_while(|&&b| b & 0xc0 == 0x80)
        .count();
    match std::str::from_utf8(&data[lead..]) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`shows_a_name`] says what [`clean_name`] would, without its allocations where it can
    /// (review ah): names of controls, bidirectional marks and white space only, at the cut
    /// and past it, with what is kept only beyond the cut.
    #[test]
    fn shows_a_name_agrees_with_clean_name() {
        let long_spaces = " ".repeat(MAX_NAME_CHARS);
        let cases = [
            String::new(),
            " ".into(),
            "\u{7}\t \u{2028}\u{202e}".into(),
            "\u{200b}\u{3164} \u{2060}".into(),
            format!("{}x", "\u{200b}".repeat(MAX_NAME_CHARS)),
            "Alice".into(),
            " \u{1b}[31mBob ".into(),
            "a".repeat(MAX_NAME_CHARS),
            "a".repeat(MAX_NAME_CHARS + 1),
            format!("{long_spaces}x"),
            format!("{}x", "\u{7}".repeat(MAX_NAME_CHARS)),
            format!("{long_spaces}\u{7}"),
            "é".repeat(200),
        ];
        for name in &cases {
            assert_eq!(shows_a_name(name), clean_name(name).is_some(), "{name:?}");
        }
    }
    /// Review aq: every lag of a worker's RTCP feed logged a warn line, and anyone who can
    /// reach the RTCP port can keep a worker behind (a flood of 1,025 datagrams a lag): the
    /// log flooded with one line a lag. Now the first lag is said, then at most one line every
    /// [`crate::said::SAID_EVERY`] with all the feeds lost since; every lost datagram is still
    /// counted.
    #[test]
    fn rtcp_feed_lag_is_logged_at_most_every_ten_seconds() {
        let logged = crate::said::Logged::default();
        let sub = logged.subscriber(tracing::Level::WARN);
        let mut gw = Gateway::new(Config::default());
        tracing::subscriber::with_default(sub, || {
            let t0 = Time::from_millis(1_000_000);
            for i in 0..1000u64 {
                // A lag every millisecond for a second, then two more within the 10 s.
                gw.rtcp_feed_lost(t0.saturating_add(Duration::from_millis(i)), 3, true);
            }
            gw.rtcp_feed_lost(t0.saturating_add(Duration::from_millis(9_999)), 5, false);
            gw.rtcp_feed_lost(t0.saturating_add(crate::said::SAID_EVERY), 7, false);
        });
        let text = logged.text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("RTCP feed lagged"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("skipped=3"), "{}", lines[0]);
        // What was lost since the first line: 999 lags of 3, one of 5 and one of 7.
        assert!(
            lines[1].contains(&format!("skipped={}", 999 * 3 + 5 + 7)),
            "{}",
            lines[1]
        );
        let s = gw.stats();
        assert_eq!(s.rtcp_feed_missed, 1000 * 3 + 5 + 7);
        assert_eq!(s.drops(DropReason::RtcpFeedLagged), 1000 * 3);
    }
}
