//! A speaker: one virtual participant's text. Usually one per RTP stream; an RTP mixer
//! (RFC 9071: one CSRC names who speaks) or a multiplexing sender carries several in one stream.

use crate::pvp::SenderId;

use crate::chunker::{Chunker, Cuts};
use crate::red::{RedFormat, RedPayload};
use crate::register::Piece;
use crate::rtp::ts_after;
use crate::stream::{Hex8, StreamKey};
use crate::t140::{DecodeStats, Decoder};
use crate::time::Time;
use smallvec::SmallVec;

/// Who speaks, within a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Voice {
    /// The stream's own source (the SSRC).
    Ssrc,
    /// A contributing source named by a mixer's single CSRC (RFC 9071 section 3).
    Csrc(u32),
    /// An in-band stream id (t140llm's `<id>\x1E` prefix).
    Named(String),
}

/// A [`Voice`] to look a speaker up by, borrowing a t140llm id from the datagram: the id is
/// copied only when it names a new speaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoiceRef<'a> {
    Ssrc,
    Csrc(u32),
    Named(&'a str),
}

impl VoiceRef<'_> {
    pub fn to_voice(self) -> Voice {
        match self {
            VoiceRef::Ssrc => Voice::Ssrc,
            VoiceRef::Csrc(c) => Voice::Csrc(c),
            VoiceRef::Named(id) => Voice::Named(id.to_owned()),
        }
    }
}

/// Longest in-band stream id accepted; longer prefixes are taken as text. t140llm takes any
/// string: a model's resource name is one (Vertex AI's run past 64 bytes, which were taken for
/// text and ran every such stream's id into its SSRC participant's transcript).
pub const MAX_NAMED_ID: usize = 255;

impl Voice {
    pub fn as_ref(&self) -> VoiceRef<'_> {
        match self {
            Voice::Ssrc => VoiceRef::Ssrc,
            Voice::Csrc(c) => VoiceRef::Csrc(*c),
            Voice::Named(id) => VoiceRef::Named(id),
        }
    }

    pub fn participant_id(&self, key: &StreamKey) -> String {
        let mut id = key.participant_id();
        self.push_suffix(&mut id);
        id
    }

    pub fn display_name(&self, key: &StreamKey) -> String {
        self.name_from(key.display_name())
    }

    /// [`Voice::participant_id`] and [`Voice::display_name`] together, as a new speaker needs
    /// them: the stream's address is spelled once ([`StreamKey::participant_id_and_name`]).
    pub fn id_and_name(&self, key: &StreamKey) -> (String, String) {
        let (mut id, stream_name) = key.participant_id_and_name();
        self.push_suffix(&mut id);
        (id, self.name_from(stream_name))
    }

    /// What this voice adds to the stream's participant id.
    fn push_suffix(&self, id: &mut String) {
        match self {
            Voice::Ssrc => {}
            Voice::Csrc(c) => {
                id.push_str("/csrc:");
                id.push_str(Hex8::new(*c).as_str());
            }
            Voice::Named(name) => {
                id.push('/');
                push_id_escaped(id, name);
            }
        }
    }

    /// This voice's display name, given the stream's.
    fn name_from(&self, stream_name: String) -> String {
        match self {
            Voice::Ssrc => stream_name,
            Voice::Csrc(c) => format!("T.140 {} via {stream_name}", Hex8::new(*c)),
            Voice::Named(id) => id.clone(),
        }
    }
}

/// A t140llm stream id as the last part of a participant id: `/` (which separates the parts:
/// `openai/gpt-4o` is a model's natural id) and `%` (so two ids never give one participant)
/// percent-encoded, and so is each UTF-8 octet of what a display name is kept from
/// ([`crate::gateway::not_in_names`]: a bidirectional override or a line separator in an id
/// clients show and the join's log line holds), the rest as it is. Runs once per new speaker,
/// not per packet.
fn push_id_escaped(id: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '/' => id.push_str("%2F"),
            '%' => id.push_str("%25"),
            c if crate::gateway::not_in_names(c) => {
                use std::fmt::Write;
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    let _ = write!(id, "%{b:02X}");
                }
            }
            c => id.push(c),
        }
    }
}

/// `participant/[scope/]stream-start-ms/`: the part of a context key before the chunk
/// counter. The scope is the speaker's own id when a mapping rule gave it a participant id that
/// other speakers may share, whose keys must differ (pvp-spec 9.1: unique in the session).
struct KeyPrefix<'a>(&'a str, Option<&'a str>, Time);

impl std::fmt::Display for KeyPrefix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)?;
        f.write_str("/")?;
        if let Some(scope) = self.1 {
            f.write_str(scope)?;
            f.write_str("/")?;
        }
        f.write_str(itoa::Buffer::new().format(self.2.as_millis()))?;
        f.write_str("/")
    }
}

/// What feeding speakers makes besides their own state, one for all of a gateway's speakers:
/// the chunks cut, which the gateway takes before it feeds the next speaker, and counters,
/// which are the gateway's totals. None of it sits in a speaker, so the speaker's hot part is
/// one cache line (docs/performance.md, section 18).
#[derive(Debug)]
pub struct Output {
    pub cuts: Cuts,
    pub decode: DecodeStats,
    /// Blocks recovered, and losses marked, by timestamp placement (mixer streams).
    pub recovered: u64,
    pub lost: u64,
    /// A mixer stream's lost packets not yet placed, after the last packet placed by
    /// timestamp: the caller keeps them with the stream for its next speaker to account for.
    pub unplaced: usize,
    /// For a mixer speaker's first packet, the newest timestamp its stream delivered before the
    /// oldest loss it may account for ([`crate::stream::Unplaced::after`]): its generations
    /// older than that were said before the stream's losses (a mixer's timestamps are one
    /// clock), so they account for none of them. Set by the caller.
    pub floor: Option<u32>,
    /// Of a mixer speaker's `gap`, the stream's unplaced losses that came before this
    /// speaker's last delivered packet: not its older text (that packet's redundancy would
    /// have told, or marked it), so they never make the U+FFFD of a packet whose every
    /// generation is new. Set by the caller.
    pub older: usize,
}

impl Output {
    pub fn new(max_chunk_chars: usize) -> Self {
        Output {
            cuts: Cuts::new(max_chunk_chars),
            decode: DecodeStats::default(),
            recovered: 0,
            lost: 0,
            unplaced: 0,
            floor: None,
            older: 0,
        }
    }
}

/// `repr(C)`, what an in-order packet touches first (chunker, idle clock, decoder), then what
/// a chunk sent reads first (join flags and the profile's address), then what neither reads:
/// the voice (the stream remembers which speaker is its own, `Stream::own`) and mixer
/// timestamps. Who the speaker is to PVP and what it sent last, read only when it joins or a
/// chunk is sent, is boxed ([`Profile`]). The stream keeps its first speaker inline, and with
/// thousands of streams every packet finds it cold in the cache: this way the speaker's hot
/// part and the stream's head share two lines, and a flush's first read is in them too.
///
/// The size is an odd multiple of 8 bytes (104): rustc then places the `SmallVec`'s word
/// before its inline speaker, in the stream's first line. At 112 it placed it after, in a third
/// line every packet reads (`stream::tests::the_packet_path_fits_in_two_cache_lines` holds
/// this).
#[derive(Debug)]
#[repr(C)]
pub struct Speaker {
    pub chunker: Chunker,
    /// Last time text changed the buffer; the idle flush counts from here.
    pub last_text: Time,
    pub decoder: Decoder,
    /// Joined the PVP session: done lazily, before the speaker's first envelope, so a stream
    /// that never carries text (a scan, a flood of random SSRCs) never becomes a participant.
    pub joined: bool,
    /// The stream mapping refused this speaker: it never joins, its text is counted and dropped.
    pub refused: bool,
    /// Last of the hot part: with the flags above, the first thing a chunk sent reads, so the
    /// flush finds it in a line the packet already loaded.
    pub profile: Box<Profile>,
    pub voice: Voice,
    /// Newest RTP timestamp delivered, for redundancy placed by timestamp (mixer streams).
    pub last_ts: Option<u32>,
}

impl Profile {
    /// The start its context keys name: the stream's (`created`), or for a speaker that took a
    /// place at the speaker bound, the millisecond it did ([`Profile::key_since`]).
    pub fn key_start(&self, created: Time) -> Time {
        let after = self.key_since.map_or(0, |ms| u64::from(ms.get()));
        Time::from_millis(created.as_millis() + after)
    }
}

impl Speaker {
    /// Bytes of the part an in-order packet reads, and a flush first.
    pub const HOT_BYTES: usize = std::mem::offset_of!(Speaker, voice);
}

/// Who a speaker is to PVP, and what it sent last.
#[derive(Debug)]
pub struct Profile {
    /// Shared with every envelope this speaker sends (the envelope's sender, no copy); from the
    /// first chunk on it also holds the `context.add` template ([`Speaker::ensure_template`]).
    pub participant: SenderId,
    /// Name: derived from the stream until RTCP SDES gives a CNAME (rank 1) or NAME (2), kept
    /// as the SDES item came (trimmed; up to 255 octets, RFC 3550 6.5) for `rtcp_name` rules to
    /// match exactly; PVP is shown it cleaned (`Gateway::participant`). A rule's `name` ranks
    /// above both.
    pub name: String,
    pub name_rank: u8,
    /// The stream mapping has decided for this speaker (`Gateway::ensure_joined`): once, so a
    /// mixer's source joining again after its BYE is who it was (its name may now be the
    /// rule's, which no `rtcp_name` rule matches).
    pub mapped: bool,
    /// Roles and session from a stream-mapping rule (else the gateway's).
    pub roles: Option<Vec<String>>,
    pub session: Option<crate::pvp::SessionText>,
    /// Chunks sent, and the number of the next chunk's context key.
    pub chunks_sent: u64,
    /// Number and content of the last chunk sent (0: none or removed): a backspace reaching
    /// past the buffer corrects it. The chunk's own text is moved here once its envelope is
    /// made: remembering costs neither a copy nor an allocation.
    pub last_sent: u64,
    pub last_sent_text: String,
    /// The speaker's own id (`t140:SSRC@ADDR...`) when a mapping rule replaced it with one
    /// that several speakers may share: it keeps their context keys apart.
    pub key_scope: Option<Box<str>>,
    /// For a speaker that took the place of another at its stream's speaker bound: the
    /// millisecond it did, as milliseconds after the stream's start (32 bits, in the padding
    /// after `name_rank`: no byte more a stream), in its context keys in place of the stream's
    /// start, so that a voice back after it left there numbers its items anew without
    /// repeating its keys ([`Profile::key_start`]).
    pub key_since: Option<std::num::NonZeroU32>,
    /// What only a speaker of a mixer's stream keeps; None for every other speaker (one
    /// pointer a stream, not the 24 bytes it holds: `cargo bench --bench scale`).
    pub mixer: Option<Box<MixerVoice>>,
}

impl Profile {
    /// [`MixerVoice::bye_at`], if any.
    pub fn bye_at(&self) -> Option<Bye> {
        self.mixer.as_ref().and_then(|m| m.bye_at)
    }

    /// The mixer's part, made on first use.
    pub fn mixer(&mut self) -> &mut MixerVoice {
        self.mixer.get_or_insert_with(Default::default)
    }
}

/// What a speaker of a mixer's stream (RFC 9071) keeps beyond every speaker's profile.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MixerVoice {
    /// What this speaker said in its last packet: a later packet's generations at timestamp
    /// offset 0 (RFC 2198 allows it), which cannot be placed by timestamp, are lined up with
    /// it. Empty until its first packet.
    pub recent: Recent,
    /// The source's RTCP BYE came and its leave waits: for packets it sent before the BYE,
    /// which the BYE may have overtaken (RFC 3550 6.3.7), held behind a gap in the mixer's
    /// sequence or still on their way.
    pub bye_at: Option<Bye>,
    /// A second BYE that came before the first's leave (the source spoke again in between):
    /// the leave after that one waits for this.
    pub bye_then: Option<Bye>,
    /// How far the mixer's clock ran ahead of this gateway's at this speaker's packets
    /// ([`Lead`]), for [`Bye::ts`].
    pub lead: Option<Lead>,
    /// The mixer restarted its sequence since this speaker's last packet ([`Piece::Restart`]):
    /// its next packet's clock is a new one, not the old one stepped.
    pub restarted: bool,
}

/// How far a mixer's clock runs ahead of this gateway's (ms, wrapping): over a speaker's
/// placed packets (a stray the register drops does not count), each counted from when it came,
/// not when it was placed (it may have waited behind a gap), the most of those of the last
/// 30-60 s. The quickest packet sets it, so one that came late does not lower it; the window
/// lets a clock that drifts from ours move it. A jump by more than [`CLOCK_RESTART_MS`] is the
/// mixer's clock restarting: it starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lead {
    now: u32,
    before: Option<u32>,
    since: Time,
    /// When the speaker's last placed packet came.
    pub at: Time,
}

/// A mixer's timestamps are one clock, in sequence order (RFC 9071 section 4): a packet stamped
/// this far from its speaker's last is the clock restarting (a new session's first timestamp
/// is random, RFC 3550 5.1), or stepping, not a late or early packet.
pub const CLOCK_RESTART_MS: u32 = 10_000;

/// How long a [`Lead`] window lasts.
const LEAD_WINDOW: u64 = 30_000_000;

/// Whether two leads (or timestamps) are more than [`CLOCK_RESTART_MS`] apart.
pub fn clock_jumped(a: u32, b: u32) -> bool {
    a.wrapping_sub(b).min(b.wrapping_sub(a)) > CLOCK_RESTART_MS
}

impl Lead {
    /// A packet stamped `ts` came at `at`.
    pub fn note(lead: &mut Option<Lead>, ts: u32, at: Time) {
        let this = ts.wrapping_sub(at.as_millis() as u32);
        match lead {
            Some(l) if !clock_jumped(this, l.now) => {
                if at.0 >= l.since.0.saturating_add(LEAD_WINDOW) {
                    (l.before, l.now, l.since) = (Some(l.now), this, at);
                } else if ts_after(this, l.now) {
                    l.now = this;
                }
                l.at = l.at.max(at);
            }
            _ => {
                *lead = Some(Lead {
                    now: this,
                    before: None,
                    since: at,
                    at,
                })
            }
        }
    }

    /// The most of this window and the one before.
    pub fn most(&self) -> u32 {
        match self.before {
            Some(b) if ts_after(b, self.now) => b,
            _ => self.now,
        }
    }
}

/// A mixer's source's BYE, as its leave waits for it ([`MixerVoice::bye_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bye {
    /// The mixer's RTP clock when the BYE was sent, as far as the receiver can tell (at most
    /// later): a packet of the source stamped up to this was sent before the BYE and is its
    /// last words; one stamped after is said after it, and joins it again. The mixer's
    /// timestamps are one clock for all its sources (RFC 9071 section 4), so once the stream
    /// has delivered a packet stamped this late, nothing sent before the BYE is missing.
    pub ts: u32,
    /// The reorder wait from the BYE (RFC 4103 5.4): by then whatever the BYE overtook has
    /// come or is lost, and the source leaves, stamped then.
    pub by: Time,
}

/// A speaker's last packet in a mixer's stream as fingerprints (FNV-1a) of its blocks: its
/// redundant generations, oldest first, then its primary, the newest four of them. RFC
/// 4103 4.2: a packet's generations are its speaker's packets before it, so these are the
/// speaker's last packets, in order, without a copy of their text.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recent {
    blocks: [u32; RECENT],
    len: u8,
}

/// Blocks a [`Recent`] keeps: RFC 4103 senders send 2 or 3 generations.
const RECENT: usize = 4;

impl Recent {
    /// `gens` (fingerprints, oldest first) then `primary`.
    fn set(&mut self, gens: &[u32], primary: &[u8]) {
        let keep = gens.len().min(RECENT - 1);
        self.blocks[..keep].copy_from_slice(&gens[gens.len() - keep..]);
        self.blocks[keep] = fingerprint(primary);
        self.len = (keep + 1) as u8;
    }

    /// The last packet's primary, if a packet was kept.
    fn primary(&self) -> Option<u32> {
        self.blocks[..usize::from(self.len)].last().copied()
    }

    /// The newest `m` blocks, oldest first (`m` at most the length).
    fn newest(&self, m: usize) -> &[u32] {
        let len = usize::from(self.len);
        &self.blocks[len - m..len]
    }
}

impl Speaker {
    pub fn new(voice: Voice, key: &StreamKey, now: Time) -> Self {
        let (id, name) = voice.id_and_name(key);
        Speaker {
            profile: Box::new(Profile {
                participant: id.into(),
                name,
                name_rank: 0,
                mapped: false,
                roles: None,
                session: None,
                chunks_sent: 0,
                last_sent: 0,
                last_sent_text: String::new(),
                key_scope: None,
                key_since: None,
                mixer: None,
            }),
            voice,
            decoder: Decoder::new(),
            chunker: Chunker::new(),
            last_text: now,
            last_ts: None,
            joined: false,
            refused: false,
        }
    }

    /// The context key of this speaker's `n`th chunk: participant, stream start, counter.
    pub fn key(&self, created: Time, n: u64) -> String {
        let p = &self.profile;
        let since = p.key_start(created);
        format!(
            "{}{n}",
            KeyPrefix(&p.participant, p.key_scope.as_deref(), since)
        )
    }

    /// Gives the participant id its `context.add` template, once, at the first chunk: the
    /// prefix of [`Speaker::key`] and the stream's source URI, escaped. Made lazily, so a
    /// speaker that never speaks holds its id alone.
    pub fn ensure_template(&mut self, key: &StreamKey, created: &Time) {
        let p = &mut self.profile;
        let id = &p.participant;
        if !id.has_template() {
            let since = p.key_start(*created);
            p.participant = id.with_template(
                KeyPrefix(id, p.key_scope.as_deref(), since),
                crate::stream::SourceUri(*key),
            );
        }
    }

    /// Text or a loss mark into the decoder and chunker; chunks cut go to `out`. Inlined for
    /// the text of an in-order packet, the piece every packet brings; a mixer's packet is
    /// placed out of line.
    #[inline]
    pub fn feed(&mut self, now: Time, piece: Piece<'_>, format: RedFormat, out: &mut Output) {
        match piece {
            Piece::Text([]) => {}
            Piece::Text(t) => {
                let sink = &mut self.chunker.fed(&mut out.cuts);
                // A keep-alive (a BOM alone) is silence: the idle flush still comes.
                if self.decoder.feed_said(t, sink, &mut out.decode) {
                    self.last_text = now;
                }
            }
            Piece::Lost => {
                self.decoder
                    .mark_loss(&mut self.chunker.fed(&mut out.cuts), &mut out.decode);
                self.last_text = now;
            }
            Piece::Packet {
                ts,
                red,
                payload,
                gap,
                at,
            } => self.place_by_ts(now, at, ts, red, payload, gap, format, out),
            Piece::Restart => {}
        }
    }

    /// RFC 9071: in a mixed stream consecutive packets carry different speakers, and each
    /// packet's redundancy is its own speaker's earlier text, so a redundant block is placed by
    /// its timestamp (packet timestamp minus offset) against what this speaker already
    /// delivered: newer is recovered text, older or equal is a repeat. Blocks at offset 0
    /// have no timestamp of their own: they are placed by content instead
    /// ([`Speaker::place_by_content`]).
    ///
    /// Loss marks: the mixer's sequence gap does not say whose packets were lost. `gap` is the
    /// stream's lost packets not yet accounted for (this packet's gap, and those earlier
    /// speakers' packets did not account for). With redundancy, this speaker's own losses show
    /// up as new generations, each one lost packet accounted for; when every non-empty
    /// generation is new and lost packets remain, this speaker's older text may be missing
    /// too, and one U+FFFD marks it. What remains unaccounted is left in `out.unplaced` for
    /// the stream's next speaker. Without redundancy nothing tells, so the gap is marked here.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn place_by_ts(
        &mut self,
        now: Time,
        at: Time,
        ts: u32,
        red: bool,
        payload: &[u8],
        gap: usize,
        format: RedFormat,
        out: &mut Output,
    ) {
        let newer = |t: u32, last: Option<u32>| last.is_none_or(|l| ts_after(t, l));
        // Fingerprints of the generations: a later packet at offset 0 lines up with them,
        // whatever offsets this one has (a sender may write both).
        let mut gens: SmallVec<[u32; 8]> = SmallVec::new();
        // Whether text came (not only a keep-alive): what the idle flush counts from.
        let mut said = false;
        // Whether a generation was taken as new: the packet comes after the last delivered.
        let mut took = false;
        let primary = if red {
            let Ok(p) = RedPayload::parse_as(payload, format) else {
                return;
            };
            gens.extend(p.redundant_blocks().map(|b| fingerprint(b.data)));
            if p.redundant_blocks()
                .any(|b| b.ts_offset == 0 && !b.data.is_empty())
            {
                (said, took) = self.place_by_content(ts, &p, &gens, gap, out);
            } else {
                (said, took) = self.place_by_offset(ts, &p, gap, out);
            }
            p.primary().data
        } else {
            let sink = &mut self.chunker.fed(&mut out.cuts);
            for _ in 0..gap {
                out.lost += 1;
                self.decoder.mark_loss(sink, &mut out.decode);
                said = true;
            }
            out.unplaced = 0;
            payload
        };
        // RFC 3550 5.1: packets made at once share a timestamp, so a primary stamped like
        // the last one is new text unless it is the last one's (a repeat under a new
        // sequence number). A packet whose generations were new text comes after the last
        // one, whatever its primary says.
        let alike = self.last_ts == Some(ts)
            && !primary.is_empty()
            && (took || self.last_primary() != Some(fingerprint(primary)));
        if alike || newer(ts, self.last_ts) {
            if !primary.is_empty() {
                let sink = &mut self.chunker.fed(&mut out.cuts);
                said |= self.decoder.feed_said(primary, sink, &mut out.decode);
            }
            self.last_ts = Some(ts);
            let m = self.profile.mixer();
            m.recent.set(&gens, primary);
            Lead::note(&mut m.lead, ts, at);
        }
        if said {
            self.last_text = now;
        }
    }

    /// The fingerprint of the last primary this mixer speaker delivered ([`Recent`]).
    fn last_primary(&self) -> Option<u32> {
        self.profile.mixer.as_ref().and_then(|m| m.recent.primary())
    }

    /// [`Speaker::place_by_ts`] for generations with timestamp offsets. Every generation
    /// newer than what this speaker delivered is one of its packets lost in the stream, an
    /// empty one (its idle tail, RFC 4103 5.2) too: each accounts for one of `gap`. So do a
    /// new speaker's generations: its earlier packets, had they arrived, would have made it a
    /// speaker already. Returns whether text came of it, and whether a generation was new.
    fn place_by_offset(
        &mut self,
        ts: u32,
        p: &RedPayload<'_>,
        gap: usize,
        out: &mut Output,
    ) -> (bool, bool) {
        // Read before the chunker is borrowed for the generations' text.
        let last = self.last_primary();
        let sink = &mut self.chunker.fed(&mut out.cuts);
        let newer = |t: u32, last: Option<u32>| last.is_none_or(|l| ts_after(t, l));
        let started = self.last_ts.is_some();
        let timed = |b: &crate::red::RedBlock<'_>| b.ts_offset != 0;
        let gens = p.redundant_blocks().filter(timed).count();
        // What the stream's losses can have been: newer than what this speaker delivered, or
        // for a new speaker than what the stream delivered.
        let since = self.last_ts.or(out.floor);
        let orig = |b: &crate::red::RedBlock<'_>| ts.wrapping_sub(u32::from(b.ts_offset));
        // RFC 3550 5.1: packets made at once share a timestamp, so generations stamped like
        // the last delivered packet and after the (last) one that is its text are packets
        // lost after it. When none is its text and none is older, they are all after it (RFC
        // 4103 4.2: a packet's generations are its source's packets just before it, so the
        // last delivered one would be among them), if the stream lost as many. Otherwise none
        // is taken: never repeat text.
        let alike_from = self.last_ts.and_then(|l| {
            let blocks = || p.redundant_blocks().filter(timed).enumerate();
            let after_its_text = blocks()
                .filter(|(_, b)| orig(b) == l && Some(fingerprint(b.data)) == last)
                .map(|(i, _)| i + 1)
                .last();
            after_its_text.or_else(|| {
                (gens > 0 && gap >= gens && !blocks().any(|(_, b)| ts_after(l, orig(&b))))
                    .then_some(0)
            })
        });
        let is_new = |i: usize, b: &crate::red::RedBlock<'_>, base: Option<u32>| {
            newer(orig(b), base) || alike_from.is_some_and(|a| i >= a)
        };
        // A new speaker delivered nothing: its generations stamped like the stream's floor
        // may be packets sent after the one delivered there (RFC 3550 5.1: stamped alike).
        let at_floor = |b: &crate::red::RedBlock<'_>| !started && since == Some(orig(b));
        let fresh = p
            .redundant_blocks()
            .filter(timed)
            .enumerate()
            .filter(|(i, b)| is_new(*i, b, since) || at_floor(b))
            .count();
        let mut left = gap.saturating_sub(fresh);
        // Every generation lost too, empty ones (an idle tail) included: older text may be
        // missing, as a plain stream's register would mark it.
        let mut text = false;
        if started && left > out.older && gens > 0 && fresh == gens {
            out.lost += 1;
            self.decoder.mark_loss(sink, &mut out.decode);
            text = true;
            left -= 1;
        }
        out.unplaced = left;
        out.recovered += fresh.min(gap) as u64;
        // Each block is judged against what was delivered before this packet, as `fresh`
        // counted them: two generations may carry one timestamp (RFC 3550 5.1: packets made at
        // once share it), and the second is as new as the first.
        let before = self.last_ts;
        for (i, b) in p.redundant_blocks().filter(timed).enumerate() {
            if !is_new(i, &b, before) {
                continue;
            }
            if !b.data.is_empty() {
                text |= self.decoder.feed_said(b.data, sink, &mut out.decode);
            }
            if newer(orig(&b), self.last_ts) {
                self.last_ts = Some(orig(&b));
            }
        }
        (text, fresh > 0)
    }

    /// [`Speaker::place_by_ts`] for generations at timestamp offset 0, which RFC 2198 allows
    /// and some senders write: they cannot be placed by timestamp. A speaker's generations
    /// are its own earlier packets, oldest first, the newest its packet before this one (RFC
    /// 4103 4.2, per speaker in a mixer's stream). If it lost `k` packets since its last one,
    /// the generations before the newest `k` are what that last packet said
    /// ([`MixerVoice::recent`]), and the newest `k` are new. The smallest `k` that lines up is
    /// taken (within the stream's unaccounted losses, `gap`, first): text is never repeated,
    /// and a block said twice in a row is told from a repeat by its neighbours. When nothing
    /// lines up within `gap`, the smallest `k` beyond it that lines up with a block the last
    /// packet said is taken in a packet (`ts`) stamped after the speaker's last, as
    /// timestamps would place them (another speaker may have taken a loss of this one's for
    /// its own older text); else the generations repeat delivered text. When only taking them all
    /// lines up (more lost than the packet carries), every one is new and, as with timestamps,
    /// one U+FFFD marks the older text that may be missing. Returns whether text came of it,
    /// and whether a generation was new.
    fn place_by_content(
        &mut self,
        ts: u32,
        p: &RedPayload<'_>,
        gens: &[u32],
        gap: usize,
        out: &mut Output,
    ) -> (bool, bool) {
        let sink = &mut self.chunker.fed(&mut out.cuts);
        let n = gens.len();
        let started = self.last_ts.is_some();
        let recent = self
            .profile
            .mixer
            .as_deref()
            .map(|m| &m.recent)
            .filter(|r| r.len > 0);
        let lines_up = |k: usize| {
            let upto = n - k;
            match recent {
                Some(r) => {
                    let m = upto.min(usize::from(r.len));
                    gens[upto - m..upto] == *r.newest(m)
                }
                None => upto == 0,
            }
        };
        // (generations taken as new, whether they are all of them for want of a match)
        let new = match started {
            false => n,
            true => (0..=gap.min(n))
                .find(|&k| lines_up(k))
                // Past the stream's unaccounted losses (another speaker took one for its own,
                // as older text that may be missing): lined up with text the speaker said,
                // not vacuously (generations that hold none of it may be the stream's, not
                // the speaker's), and only in a packet stamped after its last, so a repeat
                // of that packet (its stamp) is not taken for new.
                .or_else(|| {
                    let after = self.last_ts.is_some_and(|l| ts_after(ts, l));
                    (gap + 1..n).find(|&k| after && lines_up(k))
                })
                .unwrap_or(0),
        };
        let first_new = n - new;
        // A new speaker's generations are its packets lost here too (see place_by_offset),
        // but for the empty ones before its first text: a session's first packets carry
        // empty generations, which stand for no packet. Counted as lost ones,
        // they took another speaker's loss, which that speaker's redundancy then placed
        // against this one's later loss.
        let accounted = match started {
            true => new,
            false => {
                n - (p.redundant_blocks())
                    .take_while(|b| b.data.is_empty())
                    .count()
            }
        };
        let mut left = gap - accounted.min(gap);
        let text = p
            .redundant_blocks()
            .skip(first_new)
            .any(|b| !b.data.is_empty());
        let mut said = false;
        if started && new == n && left > out.older && text {
            out.lost += 1;
            self.decoder.mark_loss(sink, &mut out.decode);
            said = true;
            left -= 1;
        }
        out.unplaced = left;
        out.recovered += accounted.min(gap) as u64;
        for b in p.redundant_blocks().skip(first_new) {
            if !b.data.is_empty() {
                said |= self.decoder.feed_said(b.data, sink, &mut out.decode);
            }
        }
        (said, started && new > 0)
    }
}

/// FNV-1a, 32 bits, of a block: enough to line a speaker's blocks up ([`Recent`]), or to know
/// a remembered block again ([`crate::clamped`]), without keeping a copy.
pub(crate) fn fingerprint(block: &[u8]) -> u32 {
    block.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Splits t140llm's multiplex prefix `<id>\x1E<text>` (docs/t140llm.md section 6). Any id
/// t140llm takes is one, `/` included (`openai/gpt-4o`; the participant id escapes it), but
/// not an empty or over-long one, one with a control character, or one in the mixer's `csrc:`
/// namespace: those are text.
pub fn split_named(block: &[u8]) -> Option<(&str, &[u8])> {
    let at = block
        .iter()
        .take(MAX_NAMED_ID + 1)
        .position(|&b| b == 0x1e)?;
    let id = std::str::from_utf8(&block[..at]).ok()?;
    // `csrc:` is the mixer speakers' namespace: a stream id may not take it.
    let ok = !id.is_empty() && !id.starts_with("csrc:") && id.chars().all(|c| !c.is_control());
    ok.then(|| (id, &block[at + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::red::write_payload;

    fn speaker() -> Speaker {
        let key = StreamKey {
            source: "127.0.0.1:4000".parse().unwrap(),
            ssrc: 1,
        };
        Speaker::new(Voice::Csrc(7), &key, Time(0))
    }

    /// The template spells the key prefix as [`Speaker::key`] does and the source as
    /// [`StreamKey::source_uri`] does, escaped for JSON (a t140llm stream id may need it).
    #[test]
    fn the_template_spells_the_key_prefix_and_source_uri() {
        let created = Time::from_millis(1_700_000_000_123);
        for (source, voice) in [
            ("10.1.2.3:5004", Voice::Ssrc),
            ("[2001:db8::7%2]:40000", Voice::Csrc(0xfeed)),
            ("127.0.0.1:4000", Voice::Named("a\"b\\c".into())),
        ] {
            let key = StreamKey {
                source: source.parse().unwrap(),
                ssrc: 0xabcdef01,
            };
            let mut sp = Speaker::new(voice, &key, created);
            sp.ensure_template(&key, &created);
            let t = sp.profile.participant.template().expect("a template");
            let json = |s: &str| serde_json::to_string(s).unwrap();
            let unquoted = |s: String| s[1..s.len() - 1].to_owned();
            assert_eq!(
                format!("{}9", t.key_prefix),
                unquoted(json(&sp.key(created, 9))),
                "{source}"
            );
            assert_eq!(t.source, unquoted(json(&key.source_uri())), "{source}");
        }
    }

    fn red(gens: &[(u16, &str)], primary: &str) -> Vec<u8> {
        let g: Vec<(u16, &[u8])> = gens.iter().map(|(o, t)| (*o, t.as_bytes())).collect();
        let mut p = Vec::new();
        write_payload(&mut p, 98, &g, primary.as_bytes());
        p
    }

    fn feed_packet(s: &mut Speaker, out: &mut Output, ts: u32, payload: &[u8], gap: usize) {
        s.feed(
            Time(0),
            Piece::Packet {
                ts,
                red: true,
                payload,
                gap,
                at: Time(0),
            },
            RedFormat::Rfc2198,
            out,
        );
    }

    #[test]
    fn mixer_redundancy_is_placed_by_timestamp() {
        let (mut s, o) = (speaker(), &mut Output::new(500));
        feed_packet(&mut s, o, 1000, &red(&[(0, ""), (0, "")], "a"), 0);
        // The speaker's packet at 1300 was lost (along with another speaker's packet); the
        // one at 1600 carries it as redundancy, plus "a" again, which is not repeated.
        feed_packet(&mut s, o, 1600, &red(&[(600, "a"), (300, "b")], "c"), 2);
        assert_eq!(s.chunker.pending(), "abc");
        assert_eq!((o.recovered, o.lost), (1, 0));
        // Three of its packets lost: both generations are new, so older text may be missing.
        feed_packet(&mut s, o, 2800, &red(&[(600, "e"), (300, "f")], "g"), 4);
        assert_eq!(s.chunker.pending(), "abc\u{fffd}efg");
        assert_eq!((o.recovered, o.lost), (3, 1));
    }

    /// Generations at offset 0 are placed by content: with no loss to account for they repeat
    /// delivered text, whatever they hold; after a loss, those after the speaker's last block
    /// are new.
    #[test]
    fn zero_offset_generations_are_placed_by_content() {
        let (mut s, o) = (speaker(), &mut Output::new(500));
        feed_packet(&mut s, o, 1000, &red(&[], "a"), 0);
        feed_packet(&mut s, o, 1300, &red(&[(0, "x"), (0, "y")], "b"), 0);
        assert_eq!(s.chunker.pending(), "ab");
        feed_packet(&mut s, o, 1900, &red(&[(0, "b"), (0, "c")], "d"), 1);
        assert_eq!(s.chunker.pending(), "abcd");
        assert_eq!((o.recovered, o.lost, o.unplaced), (1, 0, 0));
        // Two lost in the mixer's stream, one of them this speaker's: the other is left for
        // the stream's next speaker.
        feed_packet(&mut s, o, 2500, &red(&[(0, "d"), (0, "e")], "f"), 2);
        assert_eq!(s.chunker.pending(), "abcdef");
        assert_eq!((o.recovered, o.lost, o.unplaced), (2, 0, 1));
    }

    /// RFC 4103 4.2 per speaker: the packet after two lost ones carries both as redundancy.
    /// The speaker typed "a", then "a" again (one block each, a typed "aa" or the "ll" of
    /// "hello"); the second packet is lost (the mixer's sequence shows a gap of one) and the
    /// third carries `["a", "a"]` at offset 0. The user expects "aab". The newest generation
    /// equal to the last delivered block is taken for that block, so the lost "a" is taken for
    /// a repeat: "ab", no U+FFFD, and the loss is left unplaced (for another speaker to mark).
    #[test]
    fn a_repeated_block_lost_between_zero_offset_packets_is_recovered() {
        let (mut s, o) = (speaker(), &mut Output::new(500));
        feed_packet(&mut s, o, 1000, &red(&[(0, ""), (0, "")], "a"), 0);
        // 1300: [(0, ""), (0, "a")] "a" lost.
        feed_packet(&mut s, o, 1600, &red(&[(0, "a"), (0, "a")], "b"), 1);
        assert_eq!(
            (s.chunker.pending(), o.recovered, o.lost, o.unplaced),
            ("aab", 1, 0, 0)
        );
    }

    /// The idle tail (RFC 4103 5.2: packets with empty primaries carrying the last text as
    /// redundancy) makes empty blocks common. After "hi" and its tail, the last delivered block
    /// is empty. The speaker types "c": its packet and the first tail packet are lost (a gap
    /// of two), and the last tail packet carries `["c", ""]` at offset 0. The empty generation
    /// (the lost tail packet) is taken for the last delivered block, so "c" is neither
    /// recovered nor marked: silently lost. With timestamp offsets the same packet recovers it.
    #[test]
    fn text_before_a_lost_empty_tail_packet_is_recovered_with_zero_offsets() {
        let (mut s, o) = (speaker(), &mut Output::new(500));
        feed_packet(&mut s, o, 1000, &red(&[(0, ""), (0, "")], "hi"), 0);
        feed_packet(&mut s, o, 1300, &red(&[(0, ""), (0, "hi")], ""), 0);
        feed_packet(&mut s, o, 1600, &red(&[(0, "hi"), (0, "")], ""), 0);
        // 5000: [(0, ""), (0, "")] "c" and 5300: [(0, ""), (0, "c")] "" lost.
        feed_packet(&mut s, o, 5600, &red(&[(0, "c"), (0, "")], ""), 2);
        assert!(
            s.chunker.pending().starts_with("hi") && s.chunker.pending().ends_with('c'),
            "{:?}, recovered {}, lost {}, unplaced {}",
            s.chunker.pending(),
            o.recovered,
            o.lost,
            o.unplaced
        );
    }

    /// A sender whose packets carry timestamp offsets on some packets and 0 on others (RFC
    /// 2198 allows 0; a mixer computing offsets from a clock that did not move writes it for
    /// some packets only). The speaker says "x", then "a" (a packet with real offsets), then
    /// "a" again (lost: a gap of one), then "b", whose packet carries `["a", "a"]` at offset
    /// 0. The user expects "xaab". The packet with offsets left only its primary in
    /// [`Recent`] (its generations are fingerprinted only when one is at offset 0), so the
    /// newest generation "a" lines up with it at once: the lost "a" is taken for a repeat
    /// ("xab", the loss left unplaced). Its generations `["", "x"]` would have told.
    #[test]
    fn a_repeated_block_lost_after_a_packet_with_offsets_is_recovered() {
        let (mut s, o) = (speaker(), &mut Output::new(500));
        feed_packet(&mut s, o, 1000, &red(&[(0, ""), (0, "")], "x"), 0);
        feed_packet(&mut s, o, 1300, &red(&[(600, ""), (300, "x")], "a"), 0);
        // 1600: [(0, "x"), (0, "a")] "a" lost.
        feed_packet(&mut s, o, 1900, &red(&[(0, "a"), (0, "a")], "b"), 1);
        assert_eq!(
            (s.chunker.pending(), o.recovered, o.lost, o.unplaced),
            ("xaab", 1, 0, 0)
        );
    }

    #[test]
    fn a_repeat_delivers_nothing() {
        let (mut s, o) = (speaker(), &mut Output::new(500));
        feed_packet(&mut s, o, 1000, &red(&[], "a"), 0);
        feed_packet(&mut s, o, 1000, &red(&[], "a"), 0);
        assert_eq!(s.chunker.pending(), "a");
    }

    /// A stream id's `/` and `%` are escaped in the participant id, so each id gives its own
    /// participant and the id's parts stay separated by `/` alone; the name keeps the id.
    #[test]
    fn a_stream_id_is_escaped_in_the_participant_id() {
        let key = StreamKey {
            source: "127.0.0.1:4000".parse().unwrap(),
            ssrc: 0x11223344,
        };
        let id = |name: &str| Voice::Named(name.into()).id_and_name(&key);
        let base = "t140:11223344@127.0.0.1:4000/";
        assert_eq!(id("alpha").0, format!("{base}alpha"));
        assert_eq!(
            id("openai/gpt-4o"),
            (format!("{base}openai%2Fgpt-4o"), "openai/gpt-4o".into())
        );
        assert_eq!(id("a%2Fb").0, format!("{base}a%252Fb"));
        assert_eq!(id("x/csrc:1").0, format!("{base}x%2Fcsrc:1"));
    }

    #[test]
    fn named_prefix_is_split() {
        assert_eq!(split_named(b"alpha\x1eHi"), Some(("alpha", &b"Hi"[..])));
        assert_eq!(split_named(b"Hi"), None);
        assert_eq!(split_named(b"\x1eHi"), None);
        assert_eq!(split_named(b"a/b\x1eHi"), Some(("a/b", &b"Hi"[..])));
        assert_eq!(split_named(b"a\tb\x1eHi"), None);
        assert_eq!(split_named(b"csrc:1\x1eHi"), None);
        // A model's resource name, over 64 bytes, is an id; past MAX_NAMED_ID, text.
        let mut d = vec![b'x'; 85];
        d.push(0x1e);
        assert_eq!(split_named(&d), Some(("x".repeat(85).as_str(), &b""[..])));
        let mut d = vec![b'x'; MAX_NAMED_ID + 1];
        d.push(0x1e);
        assert_eq!(split_named(&d), None);
    }
}
