//! Per-stream receive register: sequence validation (RFC 3550 appendix A.1), a bounded reorder
//! buffer (RFC 4103 section 5.4), and recovery of lost packets from RED generations
//! (RFC 2198 section 3, RFC 4103 sections 4-5).
//!
//! Out: an ordered sequence of [`Piece`]s — T140blocks to decode and loss marks — in which every
//! sequence number's text appears at most once. In-order packets pass straight through and are
//! never copied; only a packet that arrives ahead of a gap is copied into the buffer.

use crate::red::{RedError, RedFormat, RedPayload};
use crate::time::Time;

/// RFC 3550 A.1: a jump this far or further ahead of the highest sequence number received
/// is not loss but a restart or a stray packet (A.1's `udelta < MAX_DROPOUT` is in order).
pub const MAX_DROPOUT: u16 = 3000;
/// RFC 3550 A.1: less than this far behind the highest sequence number received is a late or
/// duplicate packet; this far or further, a restart or a stray packet.
pub const MAX_MISORDER: u16 = 100;

/// How far past the last packet received before a BYE a marked packet may be and still be taken
/// for one the BYE overtook ([`Register::sent_before_bye`]), not the next session's start. A BYE is sent
/// after the source's last packet and overtakes only those still in flight, a few at most with
/// T.140's packets 300 ms apart (RFC 4103 5.1), some lost before them; a new session's
/// first number is random (RFC 3550 5.1), so it lands this close to the old numbering once in
/// 4,096.
pub const OVERTAKEN_MARKED: u16 = 16;
/// Packets held waiting for a gap to fill; beyond this the oldest gap is given up at once.
pub const MAX_HELD: usize = 64;

/// A held packet's buffer is kept for reuse ([`Cold`]'s `spare`) only up to this capacity: a
/// spare buffer outlives the packet, for the stream's life, and at the capacity the largest
/// packet it ever held gave it, so 65 datagrams of 64 KiB ahead of a gap, once, left 4 MiB
/// allocated by a stream that holds nothing. RFC 4103 packets are far smaller (a 300 ms buffer
/// of typing, three RED generations), so the steady state still reuses every buffer.
const SPARE_CAPACITY: usize = 2048;

/// Spare buffers a stream keeps ([`Cold`]'s `spare`): a burst of [`MAX_HELD`] packets of
/// [`SPARE_CAPACITY`] ahead of a gap, once, left 64 of them, 128 KiB a stream that holds
/// nothing, for its life. A stream reordered now and then holds one or two packets at a time;
/// one holding more copies the rest into new buffers while it does.
const MAX_SPARES: usize = 8;

/// What the register hands to the decoder, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// A T140block (a plain payload, a RED primary, or a recovered redundant generation).
    Text(&'a [u8]),
    /// Text of one packet lost beyond recovery: the decoder writes U+FFFD (RFC 4103 5.3).
    Lost,
    /// A packet whose redundancy is placed by timestamp, per speaker, by the caller (RFC 9071
    /// mixers: consecutive packets carry different speakers, so counting back sequence numbers
    /// would take another speaker's text). `gap` lost packets came before it.
    Packet {
        ts: u32,
        red: bool,
        payload: &'a [u8],
        gap: usize,
        /// When the packet came (not when it is delivered: it may have waited behind a gap).
        at: Time,
    },
    /// The sender restarted its sequence (RFC 3550 A.1, confirmed), before the restart's
    /// packets placed by timestamp: they are on a new clock (RFC 3550 5.1: a new session's
    /// first timestamp is random), which a speaker's redundancy is not judged against as a
    /// clock that stepped. Also before a restart that starts a session (RFC 4103 5.2): an
    /// escape sequence or control string the old session left unfinished ends there.
    Restart,
}

/// One arriving packet, as the register needs it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    pub seq: u16,
    pub ts: u32,
    pub marker: bool,
    pub red: bool,
    /// Who speaks in this packet (caller-defined); handed back with every piece of it.
    pub tag: u16,
    /// Redundancy is placed by timestamp by the caller ([`Piece::Packet`]).
    pub by_ts: bool,
    /// When it came.
    pub at: Time,
    pub payload: &'a [u8],
    /// The RED payload, when the caller has already parsed (and so validated) it: a packet is
    /// parsed once on its way through, not once per look.
    pub parsed: Option<RedPayload<'a>>,
}

/// What happened to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered, possibly with held packets behind it.
    Delivered,
    /// Ahead of a gap: held until the gap fills or the wait expires.
    Held,
    /// Duplicate, or older than what was already delivered or given up.
    Stale,
    /// A jump beyond MAX_DROPOUT/MAX_MISORDER not (yet) confirmed by a following packet.
    Jump,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RegisterStats {
    pub stale: u64,
    /// Kept jump packets let go as late copies (`Register::late_copies`; `stale` counts
    /// them too): each came back [`Outcome::Jump`], so only this counts its drop (README
    /// "Sequence": late packets are counted drops). The packet that showed them copies is
    /// counted through its own [`Outcome::Stale`].
    pub stale_kept: u64,
    pub jumps: u64,
    pub restarts: u64,
    pub reordered: u64,
    /// Lost packets whose text came from a later packet's redundancy.
    pub recovered: u64,
    /// Lost packets marked with U+FFFD.
    pub lost: u64,
    /// Lost packets judged to be the redundancy-only tail before an idle period (not marked).
    pub idle_tail: u64,
    /// A stream's first packet that does not start a session (no marker bit, no BOM): its
    /// head was lost.
    pub head_lost: u64,
}

#[derive(Debug)]
struct Held {
    seq: u16,
    ts: u32,
    marker: bool,
    red: bool,
    tag: u16,
    by_ts: bool,
    /// When it came.
    at: Time,
    /// When it began to wait for the gap before it ([`Register::deadline`]): when it came,
    /// or when the restart's run it is of was confirmed ([`Register::jump`]).
    since: Time,
    payload: Vec<u8>,
}

impl Held {
    fn arrival(&self) -> Arrival<'_> {
        Arrival {
            seq: self.seq,
            ts: self.ts,
            marker: self.marker,
            red: self.red,
            tag: self.tag,
            by_ts: self.by_ts,
            at: self.at,
            payload: &self.payload,
            parsed: None,
        }
    }
}

/// Where a register's pieces go: `(tag of the packet, piece)`.
pub type Out<'o> = &'o mut dyn FnMut(u16, Piece<'_>);

/// `repr(C)`: with thousands of streams every packet finds its stream cold in the cache, so
/// the register keeps inline only what an in-order packet reads or writes (position, flags,
/// how many packets are held, the last timestamp: 16 bytes), and boxes the rest (held packets, counters, spare buffers),
/// which only loss, reordering and RED recovery reach.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Register {
    /// Next sequence number to deliver.
    expected: Option<u16>,
    /// Why an in-order packet takes the full state machine, not
    /// [`Register::advance_in_order`]: [`HEAD_WAIT`] (with [`OLD_CLOCK_HEAD`]), [`LINGER`],
    /// [`LEAVE_WAIT`]. One byte, so the in-order test reads both at once.
    slow: u8,
    /// RED layout of this sender.
    format: RedFormat,
    /// The sender never marks a session start (t140llm): a reply starts at the packet numbered
    /// or stamped 0 ([`Register::starts_reply`]).
    assume_start: bool,
    /// Most redundant generations seen on this stream, capped at 255 (RFC 4103 senders use 2
    /// or 3): a byte keeps the register's hot head small.
    generations: u8,
    /// `cold.held.len()`, kept here so the in-order test does not reach the box (at most
    /// [`MAX_HELD`]).
    holding: u8,
    /// `last_ts` is the last delivered packet's (false until one is; [`Register::resume`]
    /// restores both).
    stamped: bool,
    /// The RTP timestamp of the last packet delivered: a restart's run is judged against it
    /// ([`Register::late_copies`], [`NEW_CLOCK`]). In the head's padding: it stays 16 bytes.
    last_ts: u32,
    cold: Box<Cold>,
}

/// The part of a register that only loss, reordering and recovery reach.
#[derive(Debug, Default)]
struct Cold {
    /// Sorted by distance from `expected`.
    held: Vec<Held>,
    stats: RegisterStats,
    /// Buffers of delivered held packets, reused.
    spare: Vec<Vec<u8>>,
    /// What only a stream that jumped or whose source said BYE uses. Boxed: the others do not
    /// pay for it.
    rare: Option<Box<Rare>>,
    /// A t140llm reply's packet 0 last received (sequence 0, timestamp 0): its payload's
    /// fingerprint ([`Register::note_reply_head`]).
    reply_head: Option<u32>,
}

/// [`Cold`]'s `rare` part.
#[derive(Debug, Default)]
struct Rare {
    /// Packets of a jump not yet confirmed as a restart (RFC 3550 A.1 `bad_seq`), kept until
    /// enough of them run in sequence to be believed one (a confirmed restart delivers their
    /// text instead of marking it lost), or they prove strays. At most [`MAX_KEPT`], in
    /// arrival order.
    run: Vec<Held>,
    /// The old sequence's newest packet received (held ones too) when the last was kept: if
    /// it moved since (its live packets kept coming), packets a short way back are late
    /// duplicates, not a restart (RFC 3550 A.1's three), and those kept are strays. Not the
    /// next expected: the reorder wait giving a gap up moves that with no packet come, and a
    /// restart's marked first packet, kept across it, was dropped as a stray (its text lost
    /// unmarked, or the rest of the restart, stamped behind, dropped as late copies).
    since: u16,
    /// The source's BYE came ([`Register::mark_bye`]): where and when.
    bye: Option<Bye>,
}

/// Where a register's numbering stands ([`Register::position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The next sequence number expected.
    next: u16,
    /// [`Register`]'s `generations`.
    generations: u8,
    /// [`Register`]'s `stamped` and `last_ts`: a restart after the return is judged by its
    /// timestamps as without the eviction ([`NEW_CLOCK`], [`Register::late_copies`]).
    stamped: bool,
    last_ts: u32,
}

/// [`Register::slow`]: the stream opened without a session start, and earlier packets may still
/// arrive.
const HEAD_WAIT: u8 = 1;
/// [`Register::slow`]: the source said BYE ([`Register::mark_bye`]); its stream lingers, and
/// each packet is checked against the BYE and arms the BYE's deadline.
const LINGER: u8 = 2;
/// [`Register::slow`]: a mixer's source's leave waits after its BYE
/// ([`Register::set_leave_waits`]).
const LEAVE_WAIT: u8 = 4;
/// [`Register::slow`], with [`HEAD_WAIT`]: the head waited for is a restart's run's on the old
/// clock ([`Register::jump`]): given up, it goes as its primary alone (README "Sequence"), not
/// as a stream's head.
const OLD_CLOCK_HEAD: u8 = 8;

/// Where a source's BYE left its stream ([`Register::mark_bye`]).
#[derive(Debug, Clone, Copy)]
struct Bye {
    /// Packets up to this one (from the next expected) were sent before the BYE: the newest
    /// held when it came, else the next expected.
    newest: u16,
    /// The packet received last before the BYE: `newest` if it was held, else the one before.
    last: u16,
    at: Time,
}

/// Jump packets a register keeps: a restart's first packets swapped or duplicated still make
/// a run of three.
const MAX_KEPT: usize = 4;

/// How far past the last delivered packet's timestamp a restart's run must be stamped to be on
/// a new clock (RFC 3550 5.1: a new session's first timestamp is random), not the old one going
/// on (a translator renumbering, a sender restarting its numbering but not its clock): 2^23
/// ticks, 2.3 hours of T.140's 1000 Hz clock (RFC 4103 4.1), far longer than a stream stays
/// silent (`--stream-timeout-s`, 60 s by default). A random first stamp lands further ahead
/// nearly half the time; behind, or nearer, the run's head is taken as before.
const NEW_CLOCK: u32 = 1 << 23;

/// How far after a restart's first packet a packet kept ahead of the run may be stamped and
/// be the restart's ([`Register::jump`]): 2^16 ticks, 65 s of T.140's 1000 Hz clock (RFC 4103
/// 4.1), far longer than the restart's first packets take, and a late duplicate stamped on
/// another (random) clock lands that close once in 65,536.
const AFTER_HEAD: u32 = 1 << 16;

// `holding` counts one over the bound for a moment (`Register::receive`).
const _: () = assert!(MAX_HELD < u8::MAX as usize);

/// U+FEFF, which T.140 sends first in a session (RFC 4103 5.2), as UTF-8.
const BOM: &[u8] = "\u{feff}".as_bytes();

/// A packet's redundant generation count, as the register keeps it.
#[inline]
fn generations(p: &RedPayload<'_>) -> u8 {
    u8::try_from(p.redundant_count()).unwrap_or(u8::MAX)
}

impl Register {
    /// Bytes of the register's head, what the in-order path reads; the box follows.
    pub const HOT_BYTES: usize = std::mem::offset_of!(Register, cold);

    /// Counters since they were last taken.
    pub fn stats(&self) -> &RegisterStats {
        &self.cold.stats
    }

    /// The counters, zeroed here; `None` (without a write) when nothing was counted.
    pub fn take_stats(&mut self) -> Option<RegisterStats> {
        (self.cold.stats != RegisterStats::default()).then(|| std::mem::take(&mut self.cold.stats))
    }

    pub fn new() -> Self {
        Self::default()
    }

    fn head_wait(&self) -> bool {
        self.slow & HEAD_WAIT != 0
    }

    pub fn with_sender(format: RedFormat, assume_start: bool) -> Self {
        Register {
            format,
            assume_start,
            ..Self::default()
        }
    }

    fn redundancy(&self, a: &Arrival<'_>) -> usize {
        if a.by_ts {
            return 0;
        }
        self.red_of(a).map_or(0, |p| p.redundant_count())
    }

    /// The packet's RED payload: the caller's parse when it gave one, else parsed here (a held
    /// packet's copy, validated when it arrived).
    fn red_of<'p>(&self, a: &Arrival<'p>) -> Option<RedPayload<'p>> {
        if !a.red {
            return None;
        }
        a.parsed
            .or_else(|| RedPayload::parse_as(a.payload, self.format).ok())
    }

    /// When the oldest held packet stops waiting for its gap.
    pub fn deadline(&self, wait: std::time::Duration) -> Option<Time> {
        // Asked after every packet: with nothing held, the boxed part is not read.
        if self.held() == 0 {
            return None;
        }
        let gap = (self.cold.held.iter().map(|h| h.since).min()).map(|t| t.saturating_add(wait));
        // After its source's BYE, the wait runs from the BYE, whatever came since.
        match self.bye_deadline(wait) {
            Some(bye) => gap.map(|g| g.min(bye)),
            None => gap,
        }
    }

    /// Whether a packet held behind a gap carries text (a block other than empty or a lone
    /// BOM): the reorder wait gives it out or up. A stream that holds only empty packets,
    /// waiting for its start, never carried text, and may make room at the stream limit.
    pub fn text_behind_gap(&self) -> bool {
        self.cold.held.iter().any(|h| self.carries_text(h))
    }

    /// Whether a packet a restart's run keeps (RFC 3550 A.1) carries text: confirmed, every
    /// packet of it is said; nothing but the next packets (or the stream's end) decides it.
    pub fn text_in_run(&self) -> bool {
        let run = self.cold.rare.as_ref().map_or(&[][..], |r| &r.run[..]);
        run.iter().any(|h| self.carries_text(h))
    }

    fn carries_text(&self, h: &Held) -> bool {
        let text = |b: &[u8]| !b.is_empty() && b != BOM;
        if !h.red {
            return text(&h.payload);
        }
        match RedPayload::parse_as(&h.payload, self.format) {
            Ok(p) => text(p.primary().data) || p.redundant_blocks().any(|b| text(b.data)),
            Err(_) => !h.payload.is_empty(),
        }
    }

    /// Whether `seq` is the next expected or ahead of it, within a jump's bound (RFC 3550 A.1
    /// MAX_DROPOUT): not a late or duplicate packet.
    pub fn is_ahead(&self, seq: u16) -> bool {
        self.expected
            .is_none_or(|e| seq.wrapping_sub(e) < MAX_DROPOUT)
    }

    /// Whether a packet held (or kept in a restart's run) is for the speaker `tag`.
    pub fn holds_tag(&self, tag: u16) -> bool {
        self.held_and_kept().any(|h| h.tag == tag)
    }

    /// The packets held behind a gap, then those a restart's run keeps (RFC 3550 A.1).
    fn held_and_kept(&self) -> impl Iterator<Item = &Held> {
        let run = self.cold.rare.as_ref().map_or(&[][..], |r| &r.run[..]);
        self.cold.held.iter().chain(run)
    }

    pub fn held(&self) -> usize {
        debug_assert_eq!(usize::from(self.holding), self.cold.held.len());
        usize::from(self.holding)
    }

    /// The common case, decided without the full state machine: `seq` is the next expected
    /// packet and nothing is held or awaited, so it is delivered as it stands, its primary only
    /// (its redundancy repeats text already delivered), exactly as [`Register::receive`] would.
    /// Advances past it and returns true; otherwise changes nothing, and the packet goes
    /// through [`Register::receive`].
    #[inline]
    pub fn advance_in_order(&mut self, seq: u16, ts: u32, red: Option<&RedPayload<'_>>) -> bool {
        if self.expected != Some(seq) || self.holding != 0 || self.slow != 0 {
            return false;
        }
        if let Some(p) = red {
            self.generations = self.generations.max(generations(p));
        }
        self.expected = Some(seq.wrapping_add(1));
        (self.last_ts, self.stamped) = (ts, true);
        true
    }

    /// One packet. A malformed RED payload is refused before any state changes.
    pub fn receive(
        &mut self,
        now: Time,
        a: Arrival<'_>,
        out: Out<'_>,
    ) -> Result<Outcome, RedError> {
        let Arrival { seq, marker, .. } = a;
        if a.red {
            let p = match a.parsed {
                Some(p) => p,
                None => RedPayload::parse_as(a.payload, self.format)?,
            };
            self.generations = self.generations.max(generations(&p));
        }
        let Some(expected) = self.expected else {
            // First packet. The marker bit (RFC 4103 5.2) or a leading BOM (T.140 starts a
            // session with U+FEFF) says it starts the session; take it and any redundancy.
            if marker || self.starts_session(&a) || self.starts_reply(&a) {
                self.deliver_head(&a, out);
                self.expected = Some(seq.wrapping_add(1));
                return Ok(Outcome::Delivered);
            }
            // Otherwise the head is late or lost: wait for it as for any gap.
            self.slow |= HEAD_WAIT;
            self.expected = Some(seq);
            self.hold(now, &a, 0);
            self.cold.stats.reordered += 1;
            return Ok(Outcome::Held);
        };
        let ahead = seq.wrapping_sub(expected);
        // RFC 3550 A.1 judges a packet against the highest sequence number received
        // (`max_seq`): a jump is at least MAX_DROPOUT ahead of it or at least MAX_MISORDER
        // behind it (`udelta <= RTP_SEQ_MOD - MAX_MISORDER`). With a reorder buffer (RFC 4103
        // 5.4) the highest received is the furthest packet held, and the packets between the
        // last delivered and it are the gaps being waited for, never jumps; behind is measured
        // from the last delivered, what A.1's `max_seq` is when nothing is held. (Measured from
        // `expected`, a jump of exactly MAX_DROPOUT read as a gap of MAX_DROPOUT - 1 packets.)
        let last = expected.wrapping_sub(1);
        let max_seq = self.newest_received(expected);
        let waited_for = seq.wrapping_sub(last).wrapping_sub(1) < max_seq.wrapping_sub(last);
        let on = seq.wrapping_sub(max_seq);
        let jumped = on >= MAX_DROPOUT && last.wrapping_sub(seq) >= MAX_MISORDER;
        // Less than MAX_DROPOUT ahead, A.1 takes a gap; but MAX_MISORDER or more ahead on
        // another clock, it is a restart landing there (RFC 3550 5.1: a new session's first
        // number and timestamp are random), not hundreds of packets lost, each to be marked.
        let restarted = (MAX_MISORDER..MAX_DROPOUT).contains(&on)
            && !self.head_wait()
            && self.on_other_clock(a.ts);
        if !waited_for && (jumped || restarted) {
            return Ok(self.jump(now, &a, expected, out));
        }
        if self.cold.held.iter().any(|h| h.seq == seq) {
            self.cold.stats.stale += 1;
            return Ok(Outcome::Stale);
        }
        if self.head_wait() && ahead >= 0x8000 {
            // Earlier than the packet the stream opened with: the head is arriving late.
            if marker || self.starts_session(&a) || self.starts_reply(&a) {
                // The session's start (by its own text or its redundancy): deliver it with
                // every generation, then what waited behind it.
                self.slow &= !(HEAD_WAIT | OLD_CLOCK_HEAD);
                self.deliver_head(&a, out);
                self.expected = Some(seq.wrapping_add(1));
                self.drain(out);
                return Ok(Outcome::Delivered);
            }
            if self.held() >= MAX_HELD {
                // The wait for the head is bounded like any other: a sender walking its
                // sequence numbers backwards would otherwise be held (copied) without limit.
                self.cold.stats.stale += 1;
                return Ok(Outcome::Stale);
            }
            self.expected = Some(seq);
            self.hold(now, &a, 0);
            self.cold.stats.reordered += 1;
            return Ok(Outcome::Held);
        }
        if ahead >= 0x8000 {
            self.cold.stats.stale += 1;
            return Ok(Outcome::Stale);
        }
        if ahead == 0 {
            self.deliver(&a, 0, 0, out);
            self.expected = Some(seq.wrapping_add(1));
            self.drain(out);
            return Ok(Outcome::Delivered);
        }
        // Ahead of a gap: hold a copy, then see whether redundancy already closes the gap.
        // With the hold full, the oldest gap is given up only once the packet is in place and
        // what it closes has drained: it may be the one that fills that gap (a late arrival
        // behind those held, or a later packet whose generations reach back to it), and is
        // then delivered in its place. Given up first, its gap would be marked lost (or taken
        // for an idle tail) and the packet held behind the new position, never to drain.
        let exp = self.expected.unwrap_or(seq);
        self.hold(now, &a, exp);
        self.drain(out);
        if self.held() > MAX_HELD {
            self.give_up_oldest(out);
        }
        Ok(if self.cold.held.iter().any(|h| h.seq == seq) {
            self.cold.stats.reordered += 1;
            Outcome::Held
        } else {
            Outcome::Delivered
        })
    }

    /// Keeps a copy of a packet, in order of distance from `from`.
    fn hold(&mut self, now: Time, a: &Arrival<'_>, from: u16) {
        let seq = a.seq;
        let copy = self.copy(now, a);
        let from = if self.head_wait() {
            self.expected.unwrap_or(from)
        } else {
            from
        };
        let pos = self
            .cold
            .held
            .partition_point(|h| h.seq.wrapping_sub(from) < seq.wrapping_sub(from));
        self.cold.held.insert(pos, copy);
        self.holding += 1;
        // Every path that holds checks the bound (fuzzing runs with debug assertions): before
        // holding, or at once after it, the one packet over the bound ([`Register::receive`]).
        debug_assert!(self.cold.held.len() <= MAX_HELD + 1);
    }

    /// A packet the sequence jumped to (RFC 3550 A.1), kept ([`Rare`]'s `run`). RFC 3550 A.1
    /// believes a restart after two sequential packets; a jump back of at most MAX_DROPOUT is
    /// more likely late duplicates, which would be delivered again and move the stream back
    /// (its live packets then waiting, and marked): it needs three. (A restart's new sequence
    /// lands there 1 time in 22.) The run is the kept packets in sequence up to this one,
    /// whatever order they came in; once long enough it is delivered, every packet of it, and
    /// the stream goes on from its end (after the reorder wait for packets before its head,
    /// when its head starts no session, RFC 4103 5.4). Kept packets outside it are strays,
    /// dropped and counted as jumps, unless they lie before it, not stamped after its head,
    /// and are no copies (stamped after the last delivered packet, as on a new clock,
    /// [`NEW_CLOCK`]), start a session, or lie between such a start and the run stamped from
    /// the start's on:
    /// then they are the restart's too, and the gaps between wait as any gap. A run a short
    /// way back that is stamped before the last delivered packet and starts no session is
    /// late duplicates ([`Register::late_copies`]): dropped as stale.
    #[cold]
    #[inline(never)]
    fn jump(&mut self, now: Time, a: &Arrival<'_>, expected: u16, out: Out<'_>) -> Outcome {
        let seq = a.seq;
        let old = self.newest_received(expected);
        let short_back = expected.wrapping_sub(seq) <= MAX_DROPOUT;
        if self.cold.rare.as_ref().is_some_and(|r| r.since != old) && short_back {
            // The old sequence went on since: what was kept were strays.
            self.drop_jumped();
        }
        let rare = self.cold.rare.get_or_insert_default();
        rare.since = old;
        if rare.run.iter().any(|h| h.seq == seq) {
            self.cold.stats.stale += 1;
            return Outcome::Stale;
        }
        let (lo, hi) = Self::span(&rare.run, seq);
        let confirmed = Self::confirms(&rare.run, seq, expected, lo, hi);
        if rare.run.len() >= MAX_KEPT && !confirmed {
            // The farthest from this one goes (a stray far off, or the oldest of a run). Not
            // when this packet confirms a run with all kept: a restart's first packets out of
            // order fill the kept before their run is believed, and the farthest is then the
            // run's own first (its session start, RFC 4103 5.2), whose loss made the rest late
            // copies when stamped behind. The run is taken at once, so no more stay kept.
            let distance = |h: &Held| {
                let d = h.seq.wrapping_sub(seq);
                d.min(d.wrapping_neg())
            };
            let far = (0..rare.run.len())
                .max_by_key(|&i| distance(&rare.run[i]))
                .unwrap_or(0);
            // `remove`, not `swap_remove`: the kept stay in arrival order, which
            // [`Register::confirms`] reads (its first kept).
            let stray = rare.run.remove(far);
            self.drop_strays([stray]);
        }
        let copy = self.copy(now, a);
        let rare = self.cold.rare.get_or_insert_default();
        rare.run.push(copy);
        // Confirmed, nothing was let go above: `lo..=hi` is still the run around this packet.
        if !confirmed {
            return Outcome::Jump;
        }
        let needed = Self::needed(expected, lo);
        if needed == 3 && self.late_copies(lo, hi) {
            // Late duplicates of packets already delivered: dropped, as any stale packet.
            let run = self.cold.rare.as_mut().map(|j| std::mem::take(&mut j.run));
            let (copies, strays): (Vec<Held>, Vec<Held>) = (run.unwrap_or_default().into_iter())
                .partition(|h| h.seq.wrapping_sub(lo) <= hi.wrapping_sub(lo));
            self.drop_strays(strays);
            self.cold.stats.stale += copies.len() as u64;
            // All but this packet (the run's newest) were kept, answered `Jump`.
            self.cold.stats.stale_kept += copies.len().saturating_sub(1) as u64;
            copies.into_iter().for_each(|h| self.recycle(h.payload));
            return Outcome::Stale;
        }
        // The sender restarted its sequence: what the old one still waited for is given up,
        // then the run goes out in order, each packet's text as it came.
        self.cold.stats.restarts += 1;
        self.give_up_all(out);
        let run = self.cold.rare.as_mut().map(|j| std::mem::take(&mut j.run));
        let run = run.unwrap_or_default();
        // The run's head may follow packets of the new session lost, or kept before it (a
        // loss between them made them no run): those not stamped after the head that are no
        // copies (stamped after the last delivered) or start a session (marked, or a BOM,
        // RFC 4103 5.2: a restart's first packet), whatever the clock, are the run's; and so
        // are those between such a start and the head, stamped from the start's on (the
        // session's packets after its first, come though a later one was lost: on a clock
        // behind the old one, they have a copy's stamp, but not a copy's place).
        let head_ts = (run.iter().find(|h| h.seq == lo)).map_or(a.ts, |h| h.ts);
        let new_clock = self.on_new_clock(head_ts);
        let close = |h: &Held| {
            lo.wrapping_sub(h.seq) <= MAX_DROPOUT && !crate::rtp::ts_after(h.ts, head_ts)
        };
        let starts = |h: &Held| {
            let a = h.arrival();
            a.marker || self.starts_session(&a)
        };
        // The earliest kept start before the run: how far back, and its stamp.
        let start = (run.iter())
            .filter(|h| h.seq != lo && close(h) && starts(h))
            .map(|h| (lo.wrapping_sub(h.seq), h.ts))
            .max_by_key(|&(back, _)| back);
        let before = |h: &Held| {
            let back = lo.wrapping_sub(h.seq);
            let no_copy = self.stamped && crate::rtp::ts_after(h.ts, self.last_ts);
            let after_start =
                start.is_some_and(|(first, ts)| back < first && !crate::rtp::ts_after(ts, h.ts));
            close(h) && (no_copy || starts(h) || after_start)
        };
        // Kept a short way after the run (within MAX_DROPOUT, A.1's in order) and stamped
        // after its head, by less than [`AFTER_HEAD`]: the restart's too, come ahead of the
        // packets between (reordered), which the gap then waits for as any gap. Let go as
        // strays, their text was marked lost when the wait for the gap ended. A late duplicate
        // of the old sequence is stamped on the old clock: not after the head (it stamped its
        // run on from there), or far from it.
        let after = |h: &Held| {
            let on = h.seq.wrapping_sub(hi);
            let since_head = h.ts.wrapping_sub(head_ts);
            on != 0 && on < MAX_DROPOUT && since_head != 0 && since_head < AFTER_HEAD
        };
        let (mut run, strays): (Vec<Held>, Vec<Held>) = (run.into_iter())
            .partition(|h| h.seq.wrapping_sub(lo) <= hi.wrapping_sub(lo) || before(h) || after(h));
        // All of them lie from MAX_DROPOUT before the run's first to MAX_DROPOUT after its
        // last.
        let floor = lo.wrapping_sub(MAX_DROPOUT);
        let from = (run.iter().map(|h| h.seq))
            .min_by_key(|s| s.wrapping_sub(floor))
            .unwrap_or(lo);
        self.drop_strays(strays);
        run.sort_unstable_by_key(|h| h.seq.wrapping_sub(from));
        // Placed by timestamp, the restart's packets are on a new clock; starting a session
        // (marked, or a BOM: RFC 4103 5.2), they are no continuation of the old session's text.
        let told = |h: &&Held| h.by_ts || h.marker || self.starts_session(&h.arrival());
        if let Some(h) = run.first().filter(told) {
            out(h.tag, Piece::Restart);
        }
        // A head that does not start a session (RFC 4103 5.2) may have been overtaken by the
        // packets after it: the run waits for it as a stream's first packet does (RFC 4103
        // 5.4), from now (from its first packet's coming, a run confirmed later than the wait
        // went out as of the wait's end, dated before this packet came). Given up when the
        // wait ends, the head goes as below: on a new clock as a stream's head, its loss
        // marked; on the old one, its primary alone.
        let waits = |h: &Held| {
            let a = h.arrival();
            !(a.marker || self.starts_session(&a) || self.starts_reply(&a))
        };
        if run.first().is_some_and(waits) {
            self.slow |= if new_clock {
                HEAD_WAIT
            } else {
                HEAD_WAIT | OLD_CLOCK_HEAD
            };
            self.expected = run.first().map(|h| h.seq);
            self.holding += run.len() as u8;
            self.cold
                .held
                .extend(run.into_iter().map(|h| Held { since: now, ..h }));
            return Outcome::Held;
        }
        let mut run = run.into_iter();
        if let Some(h) = run.next() {
            // The run's first packet is the new sequence's head. On a new clock, as a
            // stream's first packet ([`Register::deliver_head`]): every redundant generation,
            // and a loss mark unless it starts a session. On the old clock going on (a
            // renumbered sender), its generations may repeat text delivered: with every
            // generation only when it starts a session (marked, or its text beginning with
            // the BOM, RFC 4103 5.2), so a lost first packet comes back, those from the
            // session's start on counted recovered as for a stream's head; else its primary.
            let a = h.arrival();
            if new_clock {
                self.deliver_head(&a, out);
            } else {
                let start = self.session_start(&a);
                match a.marker || start.1.is_some() {
                    true => self.deliver_whole(&a, start, false, out),
                    false => self.deliver(&a, 0, 0, out),
                }
            }
            self.expected = Some(h.seq.wrapping_add(1));
            self.recycle(h.payload);
        }
        // The rest in order; past a gap (packets kept before the run) held, for the reorder
        // wait from now (from when each was kept, a run confirmed later than the wait gave
        // the gap up as of the wait's end, its text dated before this packet came).
        for h in run {
            if self.holding == 0 && self.expected == Some(h.seq) {
                self.deliver(&h.arrival(), 0, 0, out);
                self.expected = Some(h.seq.wrapping_add(1));
                self.recycle(h.payload);
            } else {
                self.cold.held.push(Held { since: now, ..h });
                self.holding += 1;
            }
        }
        self.drain(out);
        Outcome::Delivered
    }

    /// How many packets in sequence make a restart's run starting at `lo` believed: three a
    /// jump back of at most MAX_DROPOUT (more likely late duplicates), else two (RFC 3550 A.1).
    fn needed(expected: u16, lo: u16) -> u16 {
        if expected.wrapping_sub(lo) <= MAX_DROPOUT {
            3
        } else {
            2
        }
    }

    /// The run in sequence around `seq` among `kept` (not among them) and it: its first and
    /// last numbers.
    fn span(kept: &[Held], seq: u16) -> (u16, u16) {
        let has = |s: u16| kept.iter().any(|h| h.seq == s);
        let (mut lo, mut hi) = (seq, seq);
        while has(lo.wrapping_sub(1)) {
            lo = lo.wrapping_sub(1);
        }
        while has(hi.wrapping_add(1)) {
            hi = hi.wrapping_add(1);
        }
        (lo, hi)
    }

    /// Whether `seq`, kept with `kept` (not among them), makes a run to be believed
    /// ([`Register::jump`]); `lo..=hi` is its run ([`Register::span`]). A restart's packets go
    /// forward: the run is believed when enough of it in sequence end at this one (as A.1's
    /// `bad_seq` is the packet after the jump), whatever of it came ahead, never from packets
    /// walking back (each the first of its run). Counted only when its newest arrives last, a
    /// run whose later packet came early (n0 n5 n2 n3 n4) went unbelieved while the kept
    /// filled, and the farthest let go was the run's session start kept before it. And when
    /// the kept are full and all of them run in sequence with this one, and this one is later
    /// in it than the first kept, they are a restart's first packets out of order (README
    /// "Sequence": the run may arrive out of order), believed now: one of them let go to keep
    /// this one was the run's own, its first (the session start) as often as not.
    fn confirms(kept: &[Held], seq: u16, expected: u16, lo: u16, hi: u16) -> bool {
        let up_to = usize::from(seq.wrapping_sub(lo)) + 1;
        if up_to >= usize::from(Self::needed(expected, lo)) {
            return true;
        }
        // Forward: this one after the first kept in the run (packets walking back, each
        // before the last, never make one).
        let len = usize::from(hi.wrapping_sub(lo)) + 1;
        let first = kept.first().map_or(seq, |h| h.seq);
        kept.len() >= MAX_KEPT
            && len == kept.len() + 1
            && seq.wrapping_sub(lo) > first.wrapping_sub(lo)
    }

    /// Whether a restart's run `lo..=hi` a short way back (RFC 3550 A.1's MAX_MISORDER to
    /// MAX_DROPOUT) is late duplicates of packets already delivered: every packet stamped
    /// before the last delivered (a copy cannot be later; 100 or more packets of a session
    /// take time, so strictly before), and none starting a session (marked or opening with the
    /// BOM, RFC 4103 5.2, also by its redundancy), which a restarting sender's first packets
    /// do. (A restart stamped behind, its random new clock, RFC 3550 5.1, and a sender at 8 kHz
    /// restarting at timestamp 0 have a copy's header but its marker; a sender that never
    /// marks a start, t140llm's, is never refused.) A kept packet up to MAX_DROPOUT before the
    /// run that starts a session is such a restart's first, come though the next was lost:
    /// the run is its, not copies.
    fn late_copies(&self, lo: u16, hi: u16) -> bool {
        let run = self.cold.rare.as_ref().map_or(&[][..], |r| &r.run[..]);
        let starts = |h: &Held| {
            let a = h.arrival();
            a.marker || self.starts_session(&a)
        };
        let copy = |h: &Held| crate::rtp::ts_after(self.last_ts, h.ts) && !starts(h);
        let in_run = |h: &Held| h.seq.wrapping_sub(lo) <= hi.wrapping_sub(lo);
        let head_before = |h: &Held| lo.wrapping_sub(h.seq) <= MAX_DROPOUT && starts(h);
        self.stamped
            && !self.assume_start
            && run.iter().filter(|h| in_run(h)).all(copy)
            && !run.iter().any(|h| !in_run(h) && head_before(h))
    }

    /// Whether `ts` is on a new clock: more than [`NEW_CLOCK`] past the last delivered
    /// packet's timestamp.
    fn on_new_clock(&self, ts: u32) -> bool {
        let past = self.last_ts.wrapping_add(NEW_CLOCK);
        self.stamped && crate::rtp::ts_after(ts, past)
    }

    /// Whether `ts`, of a packet after the last delivered, is on another clock than the
    /// stream's: stamped before the last delivered packet (a sender's clock never runs back),
    /// or on a new clock ([`Register::on_new_clock`]).
    fn on_other_clock(&self, ts: u32) -> bool {
        self.stamped && (crate::rtp::ts_after(self.last_ts, ts) || self.on_new_clock(ts))
    }

    /// A packet kept past this call (held, or a jump's): its payload copied into a spare
    /// buffer of a packet delivered before.
    fn copy(&mut self, now: Time, a: &Arrival<'_>) -> Held {
        let mut payload = self.cold.spare.pop().unwrap_or_default();
        payload.clear();
        payload.extend_from_slice(a.payload);
        Held {
            seq: a.seq,
            ts: a.ts,
            marker: a.marker,
            red: a.red,
            tag: a.tag,
            by_ts: a.by_ts,
            at: now,
            since: now,
            payload,
        }
    }

    /// Keeps a delivered or dropped packet's buffer for the next copy, unless a large packet
    /// grew it past [`SPARE_CAPACITY`] or [`MAX_SPARES`] are kept: then it is freed.
    fn recycle(&mut self, payload: Vec<u8>) {
        if payload.capacity() <= SPARE_CAPACITY && self.cold.spare.len() < MAX_SPARES {
            self.cold.spare.push(payload);
        }
    }

    /// The newest sequence number received (RFC 3550 A.1's `max_seq`): the newest held, else
    /// the last delivered. With nothing held the boxed part is not read.
    fn newest_received(&self, expected: u16) -> u16 {
        let last = expected.wrapping_sub(1);
        match self.holding {
            0 => last,
            _ => self.cold.held.last().map_or(last, |h| h.seq),
        }
    }

    /// Jump packets no restart confirmed: dropped, and counted.
    fn drop_strays(&mut self, strays: impl IntoIterator<Item = Held>) {
        for h in strays {
            self.cold.stats.jumps += 1;
            self.recycle(h.payload);
        }
    }

    /// The sender started anew with a packet that says it is a start: t140llm begins every
    /// reply at sequence 0 and timestamp 0 (docs/t140llm.md), which after a short reply is
    /// less than RFC 3550 A.1's MAX_MISORDER behind the last, so the reply's first packets were
    /// taken as stale, or as copies of those kept from a reply of two. What the old sequence
    /// still waited for is given up, what was kept of a jump dropped, and the next packet is
    /// taken as a stream's first. Whether it did (not for a stream yet to begin, or at 0).
    pub fn start_anew(&mut self, out: Out<'_>) -> bool {
        if matches!(self.expected, None | Some(0)) {
            return false;
        }
        self.cold.stats.restarts += 1;
        self.give_up_all(out);
        self.drop_jumped();
        self.slow &= !(HEAD_WAIT | OLD_CLOCK_HEAD);
        self.expected = None;
        self.stamped = false;
        true
    }

    /// A t140llm reply's packet 0 (sequence 0, timestamp 0) came, its payload's fingerprint
    /// `fp`.
    pub fn note_reply_head(&mut self, fp: u32) {
        self.cold.reply_head = Some(fp);
    }

    /// Whether a packet 0 of fingerprint `fp` is not the last reply's packet 0 again (a
    /// network's copy has the same bytes) but the next reply's: t140llm sends each reply
    /// through one socket from sequence 0 when given a custom transport, or
    /// `processAIStreamToDirectSocket` an existing one (docs/t140llm.md section 3).
    pub fn is_next_reply_head(&self, fp: u32) -> bool {
        self.cold.reply_head.is_some_and(|h| h != fp)
    }

    /// Drops what jump packets are kept (the stream is going): they count as jumps.
    pub fn drop_jumped(&mut self) {
        if let Some(r) = self.cold.rare.as_mut() {
            let strays = std::mem::take(&mut r.run);
            self.drop_strays(strays);
        }
    }

    /// Where the numbering stands, when nothing is held nor awaited (no head wait, no BYE, no
    /// leave): for a stream evicted at the stream limit, so that its next packet continues it
    /// ([`Register::resume`]) instead of being taken for a stream whose head was lost. A
    /// sender that never marks a start (t140llm's) is continued too: taken for a stream's
    /// first, its next packet would give its redundancy again.
    pub fn position(&self) -> Option<Position> {
        let next = self
            .expected
            .filter(|_| self.holding == 0 && self.slow == 0 && !self.holds_jumped())?;
        Some(Position {
            next,
            generations: self.generations,
            stamped: self.stamped,
            last_ts: self.last_ts,
        })
    }

    /// A new register goes on from `at` ([`Register::position`]): the next packet is judged
    /// against the old numbering (RFC 3550 A.1), not as a stream's first.
    pub fn resume(&mut self, at: Position) {
        self.expected = Some(at.next);
        self.generations = at.generations;
        (self.stamped, self.last_ts) = (at.stamped, at.last_ts);
    }

    fn holds_jumped(&self) -> bool {
        self.cold.rare.as_ref().is_some_and(|r| !r.run.is_empty())
    }

    /// Takes the first held packet out; with [`Register::hold`] the only places that change
    /// the held packets, so `holding` follows them.
    fn unhold_first(&mut self) -> Held {
        self.holding -= 1;
        self.cold.held.remove(0)
    }

    /// Gives up on gaps whose wait has expired: recovers what redundancy holds, marks the rest.
    pub fn expire(&mut self, now: Time, wait: std::time::Duration, out: Out<'_>) {
        while self.deadline(wait).is_some_and(|d| d <= now) {
            self.give_up_oldest(out);
        }
    }

    /// Ends the stream: every gap is given up, kept jump packets dropped.
    pub fn finish(&mut self, out: Out<'_>) {
        self.give_up_all(out);
        self.drop_jumped();
    }

    /// The source's BYE came at `now`. A BYE travels apart from the source's packets and may
    /// overtake them (RFC 3550 6.3.7): the stream lingers for the reorder wait from now
    /// ([`Register::bye_deadline`]), for the gaps it holds and for packets continuing its
    /// numbering. False when no packet was ever placed: nothing to wait for.
    pub fn mark_bye(&mut self, now: Time) -> bool {
        let (newest, last) = match (self.cold.held.last(), self.expected) {
            (Some(h), _) => (h.seq, h.seq),
            (None, Some(next)) => (next, next.wrapping_sub(1)),
            (None, None) => return false,
        };
        self.slow |= LINGER;
        let rare = self.cold.rare.get_or_insert_default();
        rare.bye.get_or_insert(Bye {
            newest,
            last,
            at: now,
        });
        true
    }

    /// When the wait after the source's BYE ends at the latest: the reorder wait from it.
    pub fn bye_deadline(&self, wait: std::time::Duration) -> Option<Time> {
        let bye = self.cold.rare.as_ref()?.bye?;
        Some(bye.at.saturating_add(wait))
    }

    /// Whether a packet arriving after its source's BYE was sent before it, which may have
    /// overtaken it: one up to the newest held when the BYE came ([`Register::mark_bye`]; a
    /// gap's, a held one's), a late duplicate at most MAX_MISORDER behind, or one continuing
    /// the numbering past it: unmarked, or marked (the first after an idle period, RFC 4103
    /// 5.2: a speaker's last words after a pause) at most [`OVERTAKEN_MARKED`] past the last
    /// packet received before the BYE. One the
    /// sequence jumps to starts a session (RFC 3550 5.1: a new session's first number is
    /// random), as does one marked further on.
    pub fn sent_before_bye(&self, seq: u16, marker: bool) -> bool {
        let (
            Some(expected),
            Some(Bye {
                newest: bye_seq,
                last,
                ..
            }),
        ) = (self.expected, self.cold.rare.as_ref().and_then(|r| r.bye))
        else {
            return false;
        };
        // Behind: a late duplicate, as far back as the register itself would not believe a
        // restart from one packet (MAX_DROPOUT), unless marked (a new session's start).
        let back = expected.wrapping_sub(seq).wrapping_sub(1);
        let behind = back < MAX_MISORDER || (back < MAX_DROPOUT && !marker);
        // Up to the newest the BYE follows, while the stream has not passed it (the register's
        // numbering moves on as late packets come in).
        let ahead = bye_seq.wrapping_sub(expected);
        let within = ahead < 0x8000 && seq.wrapping_sub(expected) <= ahead;
        let on = seq.wrapping_sub(bye_seq);
        let past = seq.wrapping_sub(last);
        let continues = on < MAX_DROPOUT && (!marker || past <= OVERTAKEN_MARKED);
        behind || within || continues
    }

    /// The timestamp of the newest packet held and when it came, if any.
    pub fn newest_held(&self) -> Option<(u32, Time)> {
        if self.held() == 0 {
            return None;
        }
        self.cold.held.last().map(|h| (h.ts, h.at))
    }

    /// Whether a packet held carries text as old as `ts` or older (RTP timestamp order): its
    /// own, or a redundant block's, stamped back by its offset (RFC 2198 3), as an idle tail
    /// (RFC 4103 5.2) carries its source's last words.
    pub fn holds_up_to(&self, ts: u32) -> bool {
        let oldest = |h: &Held| {
            let back = (h.red)
                .then(|| RedPayload::parse_as(&h.payload, self.format).ok())
                .flatten()
                .and_then(|p| p.redundant_blocks().map(|b| b.ts_offset).max())
                .unwrap_or(0);
            h.ts.wrapping_sub(u32::from(back))
        };
        self.held() > 0 && (self.cold.held.iter()).any(|h| !crate::rtp::ts_after(oldest(h), ts))
    }

    /// A mixer's source's leave waits after its BYE ([`crate::speaker::Bye`]): while one waits, every packet takes [`Register::receive`], not the in-order test,
    /// so that the gateway arms the stream's deadline, the leave's included, after it.
    pub fn leave_waits(&self) -> bool {
        self.slow & LEAVE_WAIT != 0
    }

    /// Sets [`Register::leave_waits`].
    pub fn set_leave_waits(&mut self, waits: bool) {
        if waits {
            self.slow |= LEAVE_WAIT;
        } else {
            self.slow &= !LEAVE_WAIT;
        }
    }

    fn give_up_all(&mut self, out: Out<'_>) {
        while self.held() > 0 {
            self.give_up_oldest(out);
        }
    }

    /// Delivers the first held packet, giving up the gap in front of it.
    fn give_up_oldest(&mut self, out: Out<'_>) {
        let (Some(expected), false) = (self.expected, self.held() == 0) else {
            return;
        };
        let h = self.unhold_first();
        if self.head_wait() {
            // Nothing earlier came: the stream's head was lost (RFC 4103 5.3: mark it), unless
            // this packet's redundancy reaches back to the session's start.
            let old_clock = self.slow & OLD_CLOCK_HEAD != 0;
            self.slow &= !(HEAD_WAIT | OLD_CLOCK_HEAD);
            let a = h.arrival();
            match old_clock {
                // A restart's run on the old clock: its generations may repeat text delivered.
                true => self.deliver(&a, 0, 0, out),
                false => self.deliver_head(&a, out),
            }
            self.expected = Some(h.seq.wrapping_add(1));
            self.recycle(h.payload);
            self.drain(out);
            return;
        }
        let gap = usize::from(h.seq.wrapping_sub(expected));
        let a = h.arrival();
        let carried = self.redundancy(&a);
        let covered = carried.min(gap);
        let mut unrecovered = gap - covered;
        if h.marker {
            // RFC 4103 5.2: the marker starts a burst after idle. Before going idle a sender
            // sends `generations` packets with empty primaries to carry the last text's
            // redundancy; losing those loses no text. Those the marker packet's own redundancy
            // does not already account for are presumed to be that tail, not marked. A packet
            // placed by timestamp carries its generations too (the speaker counts them against
            // the gap): presumed the tail as well, they were taken off the gap twice.
            let own = match a.by_ts {
                true => self.red_of(&a).map_or(0, |p| p.redundant_count()),
                false => carried,
            };
            let tail = unrecovered.min(usize::from(self.generations).saturating_sub(own));
            self.cold.stats.idle_tail += tail as u64;
            unrecovered -= tail;
        }
        if a.by_ts {
            // Whose text the gap held is the speakers' to tell (they count what they mark).
            self.deliver(&a, 0, unrecovered, out);
        } else {
            self.cold.stats.lost += unrecovered as u64;
            for _ in 0..unrecovered {
                out(a.tag, Piece::Lost);
            }
            self.deliver(&a, covered, 0, out);
        }
        self.expected = Some(h.seq.wrapping_add(1));
        self.recycle(h.payload);
        self.drain(out);
    }

    /// Delivers held packets that are next in line, or whose redundancy (or a later held
    /// packet's, [`Register::fill_from_later`]) covers the gap before them completely.
    fn drain(&mut self, out: Out<'_>) {
        if self.head_wait() {
            return;
        }
        while let (Some(expected), Some(h)) = (self.expected, self.cold.held.first()) {
            let gap = usize::from(h.seq.wrapping_sub(expected));
            if gap > self.redundancy(&h.arrival()) {
                if self.fill_from_later(expected, out) {
                    continue;
                }
                break;
            }
            let h = self.unhold_first();
            self.deliver(&h.arrival(), gap, 0, out);
            self.expected = Some(h.seq.wrapping_add(1));
            self.recycle(h.payload);
        }
    }

    /// The gap in front of the first held packet, which its own redundancy does not cover (a
    /// burst start sent without generations, RFC 4103 5.2), filled from a later held packet
    /// whose generations reach back over all of it (README "Reordering": a later RED packet's
    /// redundancy fills the gap at once). Generation `k` back of packet `s` is number `s - k`
    /// (RFC 4103 4.2). Moves `expected` to the first held packet and returns true, or changes
    /// nothing. The later packet, delivered in its turn, takes only the generations of numbers
    /// still missing then: none of these twice.
    #[cold]
    #[inline(never)]
    fn fill_from_later(&mut self, expected: u16, out: Out<'_>) -> bool {
        let Some(first) = self.cold.held.first().filter(|h| !h.by_ts) else {
            return false;
        };
        let (next, gap) = (first.seq, first.seq.wrapping_sub(expected));
        // Sorted by distance: none further than the most generations seen can reach back.
        let reach = u16::from(self.generations);
        let mut later = (self.cold.held[1..].iter())
            .take_while(|h| h.seq.wrapping_sub(expected) <= reach)
            .filter(|h| !h.by_ts)
            .map(|h| h.arrival());
        let Some((a, p, back)) = later.find_map(|a| {
            let back = usize::from(a.seq.wrapping_sub(expected));
            let p = self.red_of(&a).filter(|p| p.redundant_count() >= back)?;
            Some((a, p, back))
        }) else {
            return false;
        };
        let blocks = p.redundant_blocks().skip(p.redundant_count() - back);
        for block in blocks.take(usize::from(gap)) {
            out(a.tag, Piece::Text(block.data));
        }
        self.cold.stats.recovered += u64::from(gap);
        self.expected = Some(next);
        true
    }
}

impl Register {
    /// Whether a packet's earliest text starts with U+FEFF, which T.140 sends first in a
    /// session.
    fn starts_session(&self, a: &Arrival<'_>) -> bool {
        self.session_start(a).1.is_some()
    }

    /// Whether a packet of a sender that never marks a start (t140llm) is, or carries, its
    /// reply's first: t140llm numbers and stamps every reply from 0 (docs/t140llm.md section
    /// 3), so the head's oldest block (generation `k` is the packet `k` back, RFC 4103 4.2,
    /// stamped back by its offset) is numbered 0 or stamped 0. A head after it follows
    /// packets that were lost, as an unmarked RFC 4103 head does.
    fn starts_reply(&self, a: &Arrival<'_>) -> bool {
        if !self.assume_start {
            return false;
        }
        let (back, offset) = self.red_of(a).map_or((0, 0), |p| {
            let offset = p.redundant_blocks().map(|b| b.ts_offset).max();
            (p.redundant_count(), offset.unwrap_or(0))
        });
        a.seq.wrapping_sub(back as u16) == 0 || a.ts.wrapping_sub(u32::from(offset)) == 0
    }

    /// A packet's redundant generations, and which of its blocks starts a session, if one
    /// does: its earliest with text (oldest generation first, 0; the primary last, at the
    /// generations' count), when that begins with U+FEFF.
    fn session_start(&self, a: &Arrival<'_>) -> (usize, Option<usize>) {
        if !a.red {
            return (0, a.payload.starts_with(BOM).then_some(0));
        }
        let Some(p) = self.red_of(a) else {
            return (0, None);
        };
        let start = (p.redundant_blocks().map(|b| b.data))
            .chain(std::iter::once(p.primary().data))
            .enumerate()
            .find(|(_, d)| !d.is_empty())
            .and_then(|(i, d)| d.starts_with(BOM).then_some(i));
        (p.redundant_count(), start)
    }

    /// Delivers a stream's head (its first packet) with every redundant generation: the text
    /// of the packets before it that it carries. Unless it starts a session (marked, its text
    /// or its redundancy beginning with the BOM, RFC 4103 5.2; or the sender never marks one),
    /// the packets before it were lost: one U+FFFD marks them (RFC 4103 5.3, README "Loss").
    /// For a packet placed by timestamp too, as a piece of its own: handed to its speaker as a
    /// gap, a new voice's generations accounted for it. The generations it recovers
    /// ([`RegisterStats::recovered`]) are all of them after a lost head, those from the
    /// session's start on when a generation starts it, none when the packet starts it itself.
    #[inline(never)]
    fn deliver_head(&mut self, a: &Arrival<'_>, out: Out<'_>) {
        let (generations, start) = self.session_start(a);
        // A t140llm reply's start that the head carries: every generation from its oldest on.
        let start = start.or_else(|| self.starts_reply(a).then_some(0));
        let head_lost = !a.marker && start.is_none();
        if head_lost {
            self.cold.stats.head_lost += 1;
            out(a.tag, Piece::Lost);
        }
        self.deliver_whole(a, (generations, start), head_lost, out);
    }

    /// Delivers a head with every redundant generation ([`Register::deliver_head`], a
    /// restart's run head that starts a session), counting those it recovers: `start` is
    /// [`Register::session_start`]'s answer for it.
    fn deliver_whole(
        &mut self,
        a: &Arrival<'_>,
        (generations, start): (usize, Option<usize>),
        head_lost: bool,
        out: Out<'_>,
    ) {
        if !a.marker {
            let recovered = match start {
                _ if head_lost => generations,
                Some(i) => generations.saturating_sub(i),
                None => 0,
            };
            self.cold.stats.recovered += recovered as u64;
        }
        self.deliver(a, usize::MAX, 0, out);
    }

    /// Emits a packet's text: the newest `recover` redundant generations (placed by counting
    /// back sequence numbers, RFC 4103 4.2, not by timestamp offset, which real senders get
    /// wrong), then the primary. `usize::MAX` takes all generations as the stream's head.
    /// Packets placed by timestamp go out whole, with `gap` lost packets before them.
    fn deliver(&mut self, a: &Arrival<'_>, recover: usize, gap: usize, out: Out<'_>) {
        (self.last_ts, self.stamped) = (a.ts, true);
        if a.by_ts {
            out(
                a.tag,
                Piece::Packet {
                    ts: a.ts,
                    red: a.red,
                    payload: a.payload,
                    gap,
                    at: a.at,
                },
            );
            return;
        }
        if !a.red {
            out(a.tag, Piece::Text(a.payload));
            return;
        }
        let Some(p) = self.red_of(a) else {
            return; // validated on arrival; unreachable in practice
        };
        let gens = p.redundant_count();
        let take = recover.min(gens);
        for block in p.redundant_blocks().skip(gens - take) {
            if recover != usize::MAX {
                self.cold.stats.recovered += 1;
            }
            out(a.tag, Piece::Text(block.data));
        }
        out(a.tag, Piece::Text(p.primary().data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::red::write_payload;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_millis(1000);

    /// Runs packets through a register and renders what comes out: text, and `~` per loss mark.
    struct Rig {
        reg: Register,
        text: String,
    }

    impl Rig {
        fn new() -> Self {
            Rig {
                reg: Register::new(),
                text: String::new(),
            }
        }

        fn sink(text: &mut String) -> impl FnMut(u16, Piece<'_>) + '_ {
            move |_, p| match p {
                Piece::Text(t) => text.push_str(std::str::from_utf8(t).unwrap()),
                Piece::Lost => text.push('~'),
                Piece::Restart => {}
                Piece::Packet { .. } => unreachable!(),
            }
        }

        fn arrival(seq: u16, marker: bool, red: bool, payload: &[u8]) -> Arrival<'_> {
            Arrival {
                seq,
                ts: 0,
                marker,
                red,
                tag: 0,
                by_ts: false,
                at: Time::default(),
                payload,
                parsed: None,
            }
        }

        fn plain(&mut self, ms: u64, seq: u16, marker: bool, t: &str) -> Outcome {
            let a = Self::arrival(seq, marker, false, t.as_bytes());
            let mut sink = Self::sink(&mut self.text);
            self.reg
                .receive(Time::from_millis(ms), a, &mut sink)
                .unwrap()
        }

        /// [`Rig::plain`] stamped `ts`.
        fn stamped(&mut self, ms: u64, seq: u16, ts: u32, marker: bool, t: &str) -> Outcome {
            let a = Arrival {
                ts,
                ..Self::arrival(seq, marker, false, t.as_bytes())
            };
            let mut sink = Self::sink(&mut self.text);
            self.reg
                .receive(Time::from_millis(ms), a, &mut sink)
                .unwrap()
        }

        /// A live stream paced as RFC 4103 5.1 sends: packets 1 to 120, 300 ms apart and
        /// stamped as they were sent ("wN." each), and its text so far.
        fn paced_1_to_120() -> (Self, String) {
            let mut r = Rig::new();
            for seq in 1..=120u16 {
                let at = 300 * u32::from(seq);
                r.stamped(u64::from(at), seq, at, seq == 1, &format!("w{seq}."));
            }
            let before = r.text.clone();
            (r, before)
        }

        /// A stream that delivered 1000 to 1200 in order ("A" at 1050, "B" at 1051, "."
        /// elsewhere), and its text so far: late duplicates of those can follow.
        fn live_1000_to_1200() -> (Self, String) {
            let mut r = Rig::new();
            r.plain(0, 1000, true, "");
            for s in 1001..=1200u16 {
                let t = match s {
                    1050 => "A",
                    1051 => "B",
                    _ => ".",
                };
                r.plain(u64::from(s), s, false, t);
            }
            let before = r.text.clone();
            (r, before)
        }

        /// RED packet `seq` with primary `t` and redundancy `gens` (oldest first).
        fn red(&mut self, ms: u64, seq: u16, marker: bool, gens: &[&str], t: &str) -> Outcome {
            let blocks: Vec<(u16, &[u8])> = gens.iter().map(|g| (300, g.as_bytes())).collect();
            let mut p = Vec::new();
            write_payload(&mut p, 98, &blocks, t.as_bytes());
            let a = Self::arrival(seq, marker, true, &p);
            let mut sink = Self::sink(&mut self.text);
            self.reg
                .receive(Time::from_millis(ms), a, &mut sink)
                .unwrap()
        }

        fn expire(&mut self, ms: u64) {
            self.reg
                .expire(Time::from_millis(ms), WAIT, &mut Self::sink(&mut self.text));
        }
    }

    #[test]
    fn in_order_packets_pass_through() {
        let mut r = Rig::new();
        assert_eq!(r.plain(0, 10, true, "ab"), Outcome::Delivered);
        assert_eq!(r.plain(1, 11, false, "cd"), Outcome::Delivered);
        assert_eq!(r.text, "abcd");
        assert_eq!(r.reg.deadline(WAIT), None);
    }

    #[test]
    fn reordered_packets_are_put_back_in_order() {
        let mut r = Rig::new();
        r.plain(0, 1, true, "a");
        assert_eq!(r.plain(1, 3, false, "c"), Outcome::Held);
        assert_eq!(r.plain(2, 4, false, "d"), Outcome::Held);
        assert_eq!(r.text, "a");
        assert_eq!(r.reg.deadline(WAIT), Some(Time::from_millis(1001)));
        assert_eq!(r.plain(3, 2, false, "b"), Outcome::Delivered);
        assert_eq!(r.text, "abcd");
        assert_eq!(r.reg.stats().lost, 0);
        // Late duplicates of delivered packets are stale.
        assert_eq!(r.plain(4, 3, false, "c"), Outcome::Stale);
    }

    #[test]
    fn a_gap_that_never_fills_is_marked_after_the_wait() {
        let mut r = Rig::new();
        r.plain(0, 1, true, "a");
        r.plain(100, 4, false, "d");
        r.expire(1099);
        assert_eq!(r.text, "a");
        r.expire(1100);
        assert_eq!(r.text, "a~~d");
        assert_eq!(r.reg.stats().lost, 2);
        // The late packet now is stale: its place was already marked.
        assert_eq!(r.plain(1200, 2, false, "b"), Outcome::Stale);
    }

    #[test]
    fn redundancy_closes_a_gap_at_once_and_never_twice() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "a");
        // 2 and 3 lost; 4 carries them.
        assert_eq!(r.red(900, 4, false, &["b", "c"], "d"), Outcome::Delivered);
        assert_eq!(r.text, "abcd");
        assert_eq!(r.reg.stats().recovered, 2);
        // 3 arrives late: nothing repeats.
        assert_eq!(r.red(901, 3, false, &["a", "b"], "c"), Outcome::Stale);
        assert_eq!(r.text, "abcd");
    }

    #[test]
    fn a_gap_wider_than_the_redundancy_waits_then_recovers_what_it_can() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "a");
        // 2, 3, 4 lost; 5 carries 3 and 4.
        assert_eq!(r.red(300, 5, false, &["c", "d"], "e"), Outcome::Held);
        r.expire(1300);
        assert_eq!(r.text, "a~cde");
        assert_eq!((r.reg.stats().lost, r.reg.stats().recovered), (1, 2));
    }

    #[test]
    fn a_lost_redundancy_tail_before_idle_is_not_mistaken_for_lost_text() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "hi");
        r.red(300, 2, false, &["", "hi"], "");
        // 3 (last redundancy-only packet) and 4..6 lost... here just 3 and 4: the sender sent
        // 3 = ["hi", ""] "" and then went idle; the next burst starts at 4 with the marker.
        // Lose 3 only: 4's redundancy is empty (new burst), and 3 carried no new text.
        r.red(5000, 4, true, &["", ""], "yo");
        r.expire(6000);
        assert_eq!(r.text, "hiyo");
        assert_eq!(r.reg.stats().lost, 0);
    }

    #[test]
    fn a_burst_start_without_redundancy_does_not_mark_the_lost_idle_tail() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "hi");
        // 2 and 3 (redundancy-only tail) lost; the burst after idle starts with no generations.
        r.red(5000, 4, true, &[], "yo");
        r.expire(6000);
        assert_eq!(r.text, "hiyo");
        assert_eq!(r.reg.stats().idle_tail, 2);
        // Without the marker the same gap is loss.
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "hi");
        r.red(5000, 4, false, &[], "yo");
        r.expire(6000);
        assert_eq!(r.text, "hi~~yo");
    }

    /// A later held RED packet whose generations cover the whole gap in front of the first
    /// held one releases them at once (README "Reordering": "unless a later RED packet's
    /// redundancy fills the gap at once"), when the first has no redundancy of its own (a
    /// burst start without generations, as above): 1 "hi", 2 ["", "hi"] "", 3 (the idle tail)
    /// lost, 4 marked "yo" with no generations (held), then 5 ["" (3's primary), "yo"] "!".
    /// 4 and 5 waited the full reorder wait although 5 carries the missing 3 (review, session
    /// 35).
    #[test]
    fn a_later_red_packet_that_fills_the_gap_releases_the_held_packets_at_once() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "hi");
        r.red(300, 2, false, &["", "hi"], "");
        // 3 (["hi", ""] "", the last redundancy-only packet before idle) lost.
        assert_eq!(r.red(5_000, 4, true, &[], "yo"), Outcome::Held);
        assert_eq!(r.red(5_300, 5, false, &["", "yo"], "!"), Outcome::Delivered);
        assert_eq!((r.text.as_str(), r.reg.held()), ("hiyo!", 0));
        assert_eq!(r.reg.deadline(WAIT), None);
        let s = r.reg.stats();
        assert_eq!(
            (s.recovered, s.lost, s.idle_tail),
            (1, 0, 0),
            "3 came from 5"
        );
        r.expire(6_000);
        assert_eq!(r.text, "hiyo!");
    }

    /// The same across two gaps, each in front of a held packet without generations: the
    /// later packet's generations fill both, and it then delivers its primary alone (its
    /// generations of the numbers already delivered are not said again). With four
    /// generations: 1 "a", 2 "b" lost, 3 "c" and 5 "e" with none (held), 4 "d" lost, 6 carrying
    /// "b".."e". With three: 5 covers 2..=4, the first gap filled from it, the second by its
    /// own turn.
    #[test]
    fn a_later_red_packet_fills_two_gaps_and_says_nothing_twice() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", "", "", ""], "a");
        assert_eq!(r.red(600, 3, true, &[], "c"), Outcome::Held);
        assert_eq!(r.red(1_200, 5, true, &[], "e"), Outcome::Held);
        assert_eq!(r.text, "a");
        assert_eq!(
            r.red(1_500, 6, false, &["b", "c", "d", "e"], "f"),
            Outcome::Delivered
        );
        assert_eq!((r.text.as_str(), r.reg.held()), ("abcdef", 0));
        assert_eq!((r.reg.stats().recovered, r.reg.stats().lost), (2, 0));

        let mut r = Rig::new();
        r.red(0, 1, true, &["", "", ""], "a");
        assert_eq!(r.red(600, 3, true, &[], "c"), Outcome::Held);
        assert_eq!(
            r.red(1_200, 5, false, &["b", "c", "d"], "e"),
            Outcome::Delivered
        );
        assert_eq!((r.text.as_str(), r.reg.held()), ("abcde", 0));
        assert_eq!((r.reg.stats().recovered, r.reg.stats().lost), (2, 0));
    }

    /// A later packet whose generations cover only part of the gap releases nothing: 2 and 3
    /// (the idle tail) lost, 4 "yo" marked without generations, 5 ["" (3's), "yo"] "!"
    /// reaching back to 3 only. Both wait the reorder wait; then the gap is judged by 4 as
    /// before (the idle tail, not marked).
    #[test]
    fn a_later_red_packet_covering_part_of_the_gap_does_not_release_it() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "hi");
        // 2 (["", "hi"] "") and 3 (["hi", ""] "") lost.
        assert_eq!(r.red(5_000, 4, true, &[], "yo"), Outcome::Held);
        assert_eq!(r.red(5_300, 5, false, &["", "yo"], "!"), Outcome::Held);
        assert_eq!((r.text.as_str(), r.reg.held()), ("hi", 2));
        r.expire(6_000);
        assert_eq!((r.text.as_str(), r.reg.held()), ("hiyo!", 0));
        let s = r.reg.stats();
        assert_eq!((s.recovered, s.lost, s.idle_tail), (0, 0, 2));
    }

    #[test]
    fn text_lost_before_an_idle_tail_is_marked_even_after_a_marker() {
        let mut r = Rig::new();
        r.red(0, 1, true, &["", ""], "a");
        // 2 ("lost text"), 3 and 4 (its redundancy tail) lost; 5 starts a burst and carries 3, 4.
        r.red(5000, 5, true, &["", ""], "b");
        r.expire(6000);
        assert_eq!(r.text, "a~b");
        assert_eq!(r.reg.stats().lost, 1);
    }

    #[test]
    fn plain_loss_before_a_marker_packet_is_still_marked() {
        let mut r = Rig::new();
        r.plain(0, 1, true, "a");
        r.plain(10, 3, true, "c");
        r.expire(2000);
        assert_eq!(r.text, "a~c");
    }

    #[test]
    fn a_stream_whose_head_was_lost_is_marked_at_its_head_after_the_wait() {
        let mut r = Rig::new();
        assert_eq!(r.red(0, 7, false, &["x", "y"], "z"), Outcome::Held);
        assert_eq!(r.text, "");
        r.expire(1000);
        assert_eq!(r.text, "~xyz");
        assert_eq!(r.reg.stats().head_lost, 1);
    }

    /// A stream evicted at the stream limit and opened again goes on where its numbering
    /// stood: its next packet is in order, not a lost head; there is no position while its
    /// head is awaited (README "Stream limit").
    #[test]
    fn a_resumed_register_continues_its_numbering_without_a_head_wait() {
        let mut r = Rig::new();
        r.plain(0, 10, false, "");
        assert_eq!(r.reg.position(), None, "its head is awaited");
        let mut r = Rig::new();
        r.plain(0, 10, true, "\u{feff}");
        let at = r.reg.position().expect("at rest");
        let mut back = Rig::new();
        back.reg.resume(at);
        assert_eq!(back.plain(100, 11, false, "Hi"), Outcome::Delivered);
        assert_eq!(back.text, "Hi");
        assert_eq!(back.reg.stats().head_lost, 0);
    }

    #[test]
    fn a_late_head_is_put_back_in_front() {
        let mut r = Rig::new();
        assert_eq!(r.plain(0, 11, false, " world"), Outcome::Held);
        assert_eq!(r.plain(10, 10, true, "\u{feff}Hello"), Outcome::Delivered);
        assert_eq!(r.text, "\u{feff}Hello world");
        assert_eq!(r.reg.stats().head_lost, 0);
    }

    /// A packet held while the wait for a stream's head walks back to it counts as
    /// reordered, as every held packet does (`RegisterStats::reordered`: it waited in the
    /// reorder buffer): 1000 opens the stream unmarked (held), 999 unmarked (held), 998
    /// marked starts the session. The walk back held 999 uncounted (review, session 35).
    #[test]
    fn a_packet_held_while_the_head_wait_walks_back_counts_as_reordered() {
        let mut r = Rig::new();
        assert_eq!(r.plain(0, 1000, false, "c"), Outcome::Held);
        assert_eq!(r.plain(10, 999, false, "b"), Outcome::Held);
        assert_eq!(r.plain(20, 998, true, "a"), Outcome::Delivered);
        assert_eq!(r.text, "abc");
        assert_eq!(r.reg.stats().reordered, 2, "1000 and 999 both waited");
    }

    #[test]
    fn redundancy_reaching_the_session_start_is_not_a_lost_head() {
        // Packet 1 (marker, BOM + "Hi") lost; packet 2 carries it as redundancy.
        let mut r = Rig::new();
        assert_eq!(
            r.red(0, 2, false, &["", "\u{feff}Hi"], " there"),
            Outcome::Delivered
        );
        assert_eq!(r.text, "\u{feff}Hi there");
        assert_eq!(r.reg.stats().head_lost, 0);
    }

    #[test]
    fn sequence_wraps() {
        let mut r = Rig::new();
        r.plain(0, 65534, true, "a");
        r.plain(1, 0, false, "c");
        r.plain(2, 65535, false, "b");
        assert_eq!(r.text, "abc");
    }

    #[test]
    fn a_restart_is_accepted_after_two_sequential_packets() {
        let mut r = Rig::new();
        r.plain(0, 100, true, "a");
        assert_eq!(r.plain(1, 40_000, false, "x"), Outcome::Jump);
        // Its head starts no session: the run waits for packets that may have overtaken it.
        assert_eq!(r.plain(2, 40_001, false, "y"), Outcome::Held);
        assert_eq!(r.plain(3, 40_002, false, "z"), Outcome::Held);
        assert_eq!(r.text, "a");
        r.expire(1002);
        assert_eq!(r.text, "axyz");
        assert_eq!(r.reg.stats().restarts, 1);
        // A single stray far-off packet is dropped and changes nothing.
        assert_eq!(r.plain(4, 9, false, "!"), Outcome::Jump);
        assert_eq!(r.plain(5, 40_003, false, "w"), Outcome::Delivered);
        assert_eq!(r.text, "axyzw");
    }

    #[test]
    fn a_head_walking_backwards_is_bounded() {
        // Opened without a start, so the register waits for an earlier head; every packet
        // further back is a candidate, but only as many as the hold has room for.
        let mut r = Rig::new();
        assert_eq!(r.plain(0, 30_000, false, "z"), Outcome::Held);
        let mut refused = 0;
        for i in 1..2_000u16 {
            // Stale while the hold is full; a jump once further back than RFC 3550 allows.
            match r.plain(1, 30_000 - i, false, "x") {
                Outcome::Held => {}
                Outcome::Stale | Outcome::Jump => refused += 1,
                o => panic!("{o:?}"),
            }
        }
        assert_eq!(r.reg.held(), MAX_HELD);
        assert_eq!(refused, 2_000 - MAX_HELD as u64);
        // Jump packets count once let go: the last few are still kept (a restart's run is
        // believed only going forward, so they never make one).
        let kept = r.reg.cold.rare.as_ref().map_or(0, |j| j.run.len()) as u64;
        assert!(kept <= MAX_KEPT as u64);
        assert_eq!(r.reg.stats().stale + r.reg.stats().jumps + kept, refused);
        r.reg.drop_jumped();
        assert_eq!(r.reg.stats().stale + r.reg.stats().jumps, refused);
        assert!(r.reg.stats().stale > 0);
        // The wait still ends: the oldest held is given up as the head, the rest follow.
        r.expire(2_000);
        assert_eq!(r.reg.held(), 0);
        assert_eq!(r.text, format!("~{}z", "x".repeat(MAX_HELD - 1)));
    }

    #[test]
    fn the_hold_is_bounded() {
        let mut r = Rig::new();
        r.plain(0, 0, true, "");
        for i in 0..(MAX_HELD as u16 + 10) {
            r.plain(1, 2 + i, false, "x");
        }
        assert!(r.reg.held() <= MAX_HELD);
        assert!(r.text.starts_with('~'));
    }

    /// With the hold full, a late packet that fills the gap in front of everything held is
    /// delivered in its place: only the packet still missing is marked (RFC 4103 5.3: a mark
    /// a lost packet), and the stream goes on in order. Giving up the oldest gap before placing
    /// it marked both packets, then held the late one behind the delivery point, where it
    /// stalled everything behind it and, at the wait's end, was taken for 65,000 lost packets.
    #[test]
    fn a_late_packet_filling_the_gap_before_a_full_hold_is_delivered_in_place() {
        let mut r = Rig::new();
        r.plain(0, 1, true, "a");
        // 2 and 3 missing; 4..=67 held: the hold is full.
        for s in 4..=67u16 {
            assert_eq!(r.plain(10, s, false, "x"), Outcome::Held);
        }
        assert_eq!(r.reg.held(), MAX_HELD);
        // 3 arrives late, within the wait: 2 is given up, 3 and all held behind it delivered.
        assert_eq!(r.plain(20, 3, false, "c"), Outcome::Delivered);
        assert_eq!(r.reg.held(), 0);
        assert_eq!(r.text, format!("a~c{}", "x".repeat(64)));
        assert_eq!(r.reg.stats().lost, 1);
        // The stream goes on in order.
        assert_eq!(r.plain(30, 68, false, "y"), Outcome::Delivered);
        assert!(r.text.ends_with("xy"));
    }

    /// Past a full hold, a packet later than those held still gives up the oldest gap, and is
    /// itself held: the bound holds after every packet.
    #[test]
    fn past_a_full_hold_a_later_packet_gives_up_the_oldest_gap() {
        let mut r = Rig::new();
        r.plain(0, 1, true, "a");
        for s in 3..=66u16 {
            assert_eq!(r.plain(10, s, false, "x"), Outcome::Held);
        }
        // 68 (67 missing): 2 is given up, 3..=66 delivered, 68 waits for 67.
        assert_eq!(r.plain(20, 68, false, "z"), Outcome::Held);
        assert_eq!(r.reg.held(), 1);
        assert_eq!(r.text, format!("a~{}", "x".repeat(64)));
        r.expire(5_000);
        assert_eq!(r.text, format!("a~{}~z", "x".repeat(64)));
    }

    /// A sender that restarts its sequence numbers: RFC 3550 A.1 drops the jump's packet and
    /// takes the next as the new sequence. With redundancy, the next packet's newest generation
    /// is the dropped packet's text (RFC 4103 4.2), often the restarted session's start: it is
    /// delivered, not marked lost.
    #[test]
    fn a_restart_recovers_the_dropped_first_packet_from_redundancy() {
        let mut r = Rig::new();
        r.red(0, 100, true, &["", ""], "a");
        assert_eq!(
            r.red(1, 40_000, true, &["", ""], "\u{feff}x"),
            Outcome::Jump
        );
        assert_eq!(
            r.red(2, 40_001, false, &["", "\u{feff}x"], "y"),
            Outcome::Delivered
        );
        assert_eq!(r.text, "a\u{feff}xy");
        assert_eq!(r.reg.stats().lost, 0);
        assert_eq!(r.reg.stats().restarts, 1);
        // Without redundancy too: the jump's packet was kept, and goes out once confirmed.
        let mut r = Rig::new();
        r.plain(0, 100, true, "a");
        assert_eq!(r.plain(1, 40_000, true, "x"), Outcome::Jump);
        assert_eq!(r.plain(2, 40_001, false, "y"), Outcome::Delivered);
        assert_eq!(r.text, "axy");
        assert_eq!(r.reg.stats().lost, 0);
    }

    /// A stream delivered 1000..=1200 and went quiet; a late duplicate of 1048 comes (more than
    /// MAX_MISORDER behind: kept as a jump), then the sender restarts its sequence at 1050 with a
    /// marked session start, 1050, 1051, 1052 in order (a jump back, confirmed by three). The
    /// restart is "x", "y", "z", marked as a session start, nothing of it lost. The kept
    /// duplicate is 2 before the run: it stays a stray, "xyz" with nothing marked. README
    /// "Sequence": jump packets no restart confirms (late duplicates) are dropped; "Redundancy":
    /// text is never delivered twice. A rework that took kept packets near the run into it
    /// (reverted the same day) said 1048's text again behind a U+FFFD: "~D~xyz" (review, session
    /// 32).
    #[test]
    fn an_old_late_duplicate_just_before_a_restart_is_not_said_again_as_its_head() {
        let (mut r, before) = Rig::live_1000_to_1200();
        assert_eq!(r.plain(2000, 1048, false, "D"), Outcome::Jump);
        r.plain(3000, 1050, true, "x");
        r.plain(3300, 1051, false, "y");
        r.plain(3600, 1052, false, "z");
        r.expire(10_000);
        let s = *r.reg.stats();
        assert_eq!(
            (&r.text[before.len()..], s.restarts, s.head_lost, s.lost),
            ("xyz", 1, 0, 0),
            "the restart's text once, unmarked; the late duplicate dropped"
        );
    }

    /// As above, but the late duplicate is of 1054, 2 after the restart's run 1050..=1052: the new
    /// 1054 ("v") is delivered in its place. The reverted rework held the old 1054 as a packet of
    /// the run, delivered it in the new one's place and dropped the new one as stale: "xyzwD"
    /// (review, session 32).
    #[test]
    fn an_old_late_duplicate_just_after_a_restart_does_not_take_a_new_packets_place() {
        let (mut r, before) = Rig::live_1000_to_1200();
        assert_eq!(r.plain(2000, 1054, false, "D"), Outcome::Jump);
        r.plain(3000, 1050, true, "x");
        r.plain(3300, 1051, false, "y");
        r.plain(3600, 1052, false, "z");
        r.plain(3900, 1053, false, "w");
        let last = r.plain(4200, 1054, false, "v");
        r.expire(10_000);
        assert_eq!(
            (&r.text[before.len()..], last),
            ("xyzwv", Outcome::Delivered),
            "the restart's 1054 is delivered, the old one's duplicate is not"
        );
    }

    /// A jump's packets are kept only while they run in sequence: a stray packet before the
    /// restart is not delivered with it, and a packet of the run lost before the confirming
    /// one is marked as before.
    #[test]
    fn a_restart_delivers_only_the_run_it_confirms() {
        let mut r = Rig::new();
        r.plain(0, 100, true, "a");
        // A stray packet far ahead, then the restart's run elsewhere.
        assert_eq!(r.plain(1, 20_000, false, "stray"), Outcome::Jump);
        assert_eq!(r.plain(2, 40_000, true, "x"), Outcome::Jump);
        assert_eq!(r.plain(3, 40_001, false, "y"), Outcome::Delivered);
        assert_eq!(r.text, "axy");
        // A jump back within MAX_DROPOUT needs three in sequence: both kept go out. A run
        // broken before it is confirmed starts again, and the packet before the break was a
        // stray (4001 never came): only the confirmed run is delivered.
        let mut r = Rig::new();
        r.plain(0, 5000, true, "a");
        assert_eq!(r.plain(1, 4000, false, "p"), Outcome::Jump);
        assert_eq!(r.plain(2, 4001, false, "q"), Outcome::Jump);
        assert_eq!(r.plain(3, 4002, false, "r"), Outcome::Held);
        r.expire(2000);
        assert_eq!(r.text, "apqr");
        let mut r = Rig::new();
        r.plain(0, 5000, true, "a");
        assert_eq!(r.plain(1, 4000, false, "p"), Outcome::Jump);
        assert_eq!(r.plain(2, 4002, false, "q"), Outcome::Jump);
        assert_eq!(r.plain(3, 4003, false, "r"), Outcome::Jump);
        assert_eq!(r.plain(4, 4004, false, "s"), Outcome::Held);
        r.expire(2000);
        assert_eq!(r.text, "aqrs");
        assert_eq!(r.reg.stats().lost, 0);
    }

    /// Two late duplicates in a row, more than MAX_MISORDER behind: RFC 3550 A.1 read
    /// literally takes them for a restart, which delivered the second's text again and moved
    /// the stream back, so the live packets after it waited and were marked lost (about 150
    /// marks here). A jump back that short needs a third sequential packet.
    #[test]
    fn two_late_duplicates_far_behind_are_not_a_restart() {
        let (mut r, before) = Rig::live_1000_to_1200();
        assert_eq!(r.plain(2000, 1050, false, "A"), Outcome::Jump);
        assert_eq!(r.plain(2001, 1051, false, "B"), Outcome::Jump);
        assert_eq!(r.plain(2002, 1201, false, "x"), Outcome::Delivered);
        assert_eq!(r.plain(2003, 1202, false, "y"), Outcome::Delivered);
        r.expire(10_000);
        assert_eq!(&r.text[before.len()..], "xy");
        assert_eq!(r.reg.stats().restarts, 0);
    }

    /// A stream live for `hours` (a packet every 30 s, stamped by `clock`), then a restart 500
    /// back on the same clock, its three packets together: the outcomes and the text after.
    fn restart_after(hours: u64, clock: impl Fn(u64) -> u32) -> (Vec<Outcome>, String) {
        let mut r = Rig::new();
        let (mut seq, mut t) = (1u16, 0u64);
        while t <= hours * 3_600_000 {
            r.stamped(t, seq, clock(t), t == 0, ".");
            (seq, t) = (seq.wrapping_add(1), t + 30_000);
        }
        let (before, back) = (r.text.len(), seq.wrapping_sub(500));
        let outcomes = (0..3u16)
            .map(|k| {
                let ts = clock(t).wrapping_add(300 * u32::from(k));
                r.stamped(t, back.wrapping_add(k), ts, k == 0, &format!("r{k}."))
            })
            .collect();
        (outcomes, r.text[before..].to_owned())
    }

    /// A RED packet stamped `ts`, its two generations 300 back each (RFC 2198).
    fn red_stamped(r: &mut Rig, ms: u64, seq: u16, ts: u32, m: bool, g: [&str; 2], t: &str) {
        let mut p = Vec::new();
        let gens = [(300, g[0].as_bytes()), (300, g[1].as_bytes())];
        write_payload(&mut p, 98, &gens, t.as_bytes());
        let a = Arrival {
            ts,
            ..Rig::arrival(seq, m, true, &p)
        };
        let mut sink = Rig::sink(&mut r.text);
        r.reg.receive(Time::from_millis(ms), a, &mut sink).unwrap();
    }

    /// A sender that restarted its sequence with a new random timestamp behind its old one
    /// (half of them land there), and a sequence a short way back (110 behind), sends live,
    /// 300 ms apart: its run is believed at its third packet, its text whole. (This and the
    /// five below pin restarts that three rounds of a rule telling late duplicates from
    /// restarts by their stamps and pacing lost or delayed: `tests/mixer_clock.rs`.)
    #[test]
    fn a_restart_stamped_behind_and_paced_is_believed() {
        let (mut r, before) = Rig::paced_1_to_120();
        let mut outcomes = Vec::new();
        for (i, seq) in (10..=13u16).enumerate() {
            let k = i as u32;
            outcomes.push(r.stamped(
                40_000 + 300 * u64::from(k),
                seq,
                9_000 + 300 * k,
                i == 0,
                &format!("r{i}."),
            ));
        }
        assert_eq!(
            outcomes,
            [
                Outcome::Jump,
                Outcome::Jump,
                Outcome::Delivered,
                Outcome::Delivered
            ]
        );
        assert_eq!(&r.text[before.len()..], "r0.r1.r2.r3.");
        assert_eq!(r.reg.stats().restarts, 1);
    }

    /// A restart whose timestamps go on from the old clock (stamped where a live packet would
    /// be) is believed at its third packet even when its packets come together.
    #[test]
    fn a_restart_on_the_live_clock_is_believed_though_its_packets_come_together() {
        let (mut r, before) = Rig::paced_1_to_120();
        let outcomes: Vec<Outcome> = (10..=12u16)
            .map(|seq| {
                let ts = 40_000 + 300 * u32::from(seq - 10);
                r.stamped(40_000, seq, ts, seq == 10, &format!("r{seq}."))
            })
            .collect();
        assert_eq!(outcomes, [Outcome::Jump, Outcome::Jump, Outcome::Delivered]);
        assert_eq!(&r.text[before.len()..], "r10.r11.r12.");
    }

    /// An exact 1000 Hz sender live 1,194 hours (past 2^32 ms, the timestamp wrapped, RFC
    /// 3550 5.1) restarts on its clock, its packets together: believed at its third.
    #[test]
    fn a_restart_on_the_live_clock_after_the_timestamp_wraps_is_believed() {
        let (outcomes, text) = restart_after(1194, |t| t as u32);
        assert_eq!(outcomes, [Outcome::Jump, Outcome::Jump, Outcome::Delivered]);
        assert_eq!(text, "r0.r1.r2.");
    }

    /// A sender whose clock runs 100 ppm slow restarts on its clock after 20 hours (7.2 s
    /// behind where its first packet's stamp projects the live one), its packets together:
    /// believed at its third.
    #[test]
    fn a_restart_on_a_drifting_clock_after_hours_is_believed() {
        let (outcomes, text) = restart_after(20, |t| (t - t / 10_000) as u32);
        assert_eq!(outcomes, [Outcome::Jump, Outcome::Jump, Outcome::Delivered]);
        assert_eq!(text, "r0.r1.r2.");
    }

    /// A sender on an 8 kHz clock (not RFC 4103's 1000 Hz), each session from timestamp 0,
    /// paced 300 ms, restarts: its timestamps run 8 times faster than time and its restart is
    /// stamped in the stream's past. It is believed at its third packet.
    #[test]
    fn a_paced_restart_of_a_sender_not_at_1000_hz_is_believed() {
        let mut r = Rig::new();
        for k in 0..120u16 {
            r.stamped(300 * u64::from(k), 1 + k, 2_400 * u32::from(k), k == 0, ".");
        }
        let before = r.text.len();
        for k in 0..6u16 {
            let at = 40_000 + 300 * u64::from(k);
            r.stamped(at, 1 + k, 2_400 * u32::from(k), k == 0, &format!("r{k}."));
        }
        let got = (r.reg.stats().restarts, &r.text[before..]);
        assert_eq!(got, (1, "r0.r1.r2.r3.r4.r5."));
    }

    /// RED, two generations: a sender restarts at 10 (stamped in the stream's past), its first
    /// three packets held up and coming together, then 13..15 at its pace: nothing is lost,
    /// nothing marked (RFC 4103 5.3).
    #[test]
    fn a_restart_whose_first_packets_came_together_loses_nothing_with_redundancy() {
        let mut r = Rig::new();
        let w = |s: u16| {
            if s == 0 {
                String::new()
            } else {
                format!("w{s}.")
            }
        };
        for s in 1..=120u16 {
            let at = 300 * u32::from(s);
            let gens = [&w(s.max(2) - 2), &w(s - 1)];
            red_stamped(
                &mut r,
                at.into(),
                s,
                at,
                s == 1,
                gens.map(String::as_str),
                &w(s),
            );
        }
        let before = r.text.len();
        let t = ["", "", "\u{feff}r0.", "r1.", "r2.", "r3.", "r4.", "r5."];
        for k in 0..6usize {
            let at = 40_000 + 300 * (k.max(2) as u64 - 2);
            let ts = 9_000 + 300 * k as u32;
            red_stamped(
                &mut r,
                at,
                10 + k as u16,
                ts,
                k == 0,
                [t[k], t[k + 1]],
                t[k + 2],
            );
        }
        assert_eq!(&r.text[before..], "\u{feff}r0.r1.r2.r3.r4.r5.");
        assert_eq!((r.reg.stats().restarts, r.reg.stats().lost), (1, 0));
    }

    /// RFC 3550 A.1 `update_seq`, the branch a packet takes against the highest sequence
    /// number received (`max_seq`), with `udelta = seq - max_seq`: `udelta < MAX_DROPOUT` is
    /// in order (with a permissible gap), `udelta <= RTP_SEQ_MOD - MAX_MISORDER` a very large
    /// jump (`bad_seq`), anything else a duplicate or reordered packet.
    fn a1_is_jump(max_seq: u16, seq: u16) -> bool {
        let udelta = u32::from(seq.wrapping_sub(max_seq));
        udelta >= u32::from(MAX_DROPOUT) && udelta <= 65536 - u32::from(MAX_MISORDER)
    }

    /// The jump limits at their boundaries, as RFC 3550 A.1 draws them: 2,999 ahead of the last
    /// packet is a gap (waited for, then marked), 3,000 and 3,001 are jumps (dropped until a
    /// following packet confirms a restart); 99 behind is a late packet, 100 and 101 jumps.
    /// Measured from the packet before the next expected one (A.1's `max_seq`), not from the
    /// next expected one: a jump of exactly 3,000 was taken for a gap of 2,999 lost packets.
    /// With packets held behind a gap, `max_seq` is the furthest of them.
    #[test]
    fn sequence_jumps_are_judged_at_rfc3550_a1s_boundaries() {
        let jump = |outcome: Outcome| outcome == Outcome::Jump;
        for (d, ahead) in [
            (2_999, true),
            (3_000, true),
            (3_001, true),
            (99, false),
            (100, false),
            (101, false),
        ] {
            let mut r = Rig::new();
            r.plain(0, 1000, true, "a");
            let seq = if ahead { 1000u16 + d } else { 1000u16 - d };
            let got = jump(r.plain(1, seq, false, "b"));
            assert_eq!(
                got,
                a1_is_jump(1000, seq),
                "{} {d}",
                if ahead { "ahead" } else { "behind" }
            );
        }
        // Spelled out, ahead: 2,999 waits as a gap; 3,000 and 3,001 are jumps.
        let mut r = Rig::new();
        r.plain(0, 1000, true, "a");
        assert_eq!(r.plain(1, 3999, false, "b"), Outcome::Held);
        for d in [3_000, 3_001] {
            let mut r = Rig::new();
            r.plain(0, 1000, true, "a");
            assert_eq!(r.plain(1, 1000 + d, false, "b"), Outcome::Jump, "{d}");
            assert_eq!(r.reg.held(), 0);
        }
        // With packets held, from the furthest of them: 10 and 20 are held behind a gap at 2.
        for (d, want) in [(2_999, Outcome::Held), (3_000, Outcome::Jump)] {
            let mut r = Rig::new();
            r.plain(0, 1, true, "a");
            r.plain(1, 10, false, "x");
            r.plain(2, 20, false, "y");
            assert_eq!(r.plain(3, 20 + d, false, "z"), want, "{d}");
            assert!(jump(want) == a1_is_jump(20, 20 + d));
        }
    }

    /// RFC 4103 5.4: a packet that fills the gap in front of the held packets, arriving within
    /// the reorder wait, is delivered in its place. Here 150 waits behind the gap 2..=149 (a
    /// burst of reordering). Since jumps are measured from the furthest held packet, 2 is more
    /// than MAX_MISORDER "behind" 150 and is dropped as a jump; 3 then "confirms a restart":
    /// the hold is given up (148 loss marks and 150's text delivered before 3's), 2's text is
    /// marked lost although it arrived, and the stream is moved back to 4, so 4..=149 are
    /// waited for and marked a second time. Measured from `expected` (as before dff1be8) 2 and
    /// 3 are simply delivered.
    #[test]
    fn late_packets_filling_the_gap_before_a_wide_hold_are_delivered_not_taken_for_a_restart() {
        let mut r = Rig::new();
        r.plain(0, 1, true, "a");
        assert_eq!(r.plain(10, 150, false, "z"), Outcome::Held);
        let two = r.plain(20, 2, false, "b");
        let three = r.plain(30, 3, false, "c");
        assert_eq!(
            (two, three, r.reg.stats().restarts),
            (Outcome::Delivered, Outcome::Delivered, 0),
            "text so far: {:?}",
            r.text
        );
        assert_eq!(r.text, "abc");
        assert_eq!(r.reg.held(), 1);
    }

    /// A stream opened without its start waits for its head (RFC 4103 5.4, as for any gap).
    /// Here 1000 opened it and 1150 is held behind it; the head, 999 with the marker, arrives
    /// within the wait. Measured from the furthest held packet (1150) the head is 151 behind,
    /// a "jump", and is dropped: the session's start is lost and, at the wait's end, 1000 is
    /// marked as a lost head. One behind the packet that opened the stream, it must be taken.
    #[test]
    fn a_late_head_in_front_of_a_wide_head_wait_is_delivered() {
        let mut r = Rig::new();
        assert_eq!(r.plain(0, 1000, false, "x"), Outcome::Held);
        assert_eq!(r.plain(10, 1150, false, "z"), Outcome::Held);
        assert_eq!(r.plain(20, 999, true, "\u{feff}H"), Outcome::Delivered);
        assert_eq!(r.text, "\u{feff}Hx");
        assert_eq!(r.reg.stats().head_lost, 0);
    }

    /// A restart whose new sequence lands a little behind the old one is believed at its third
    /// sequential packet; with RFC 4103's two generations of redundancy that packet carries
    /// both dropped packets' text, and nothing is lost.
    #[test]
    fn a_restart_a_little_behind_is_believed_at_its_third_packet_and_loses_nothing() {
        let mut r = Rig::new();
        r.red(0, 5000, true, &["", ""], "a");
        assert_eq!(r.red(1, 4000, true, &["", ""], "\u{feff}x"), Outcome::Jump);
        assert_eq!(
            r.red(2, 4001, false, &["", "\u{feff}x"], "y"),
            Outcome::Jump
        );
        assert_eq!(
            r.red(3, 4002, false, &["\u{feff}x", "y"], "z"),
            Outcome::Delivered
        );
        assert_eq!(r.text, "a\u{feff}xyz");
        assert_eq!(r.reg.stats().restarts, 1);
        assert_eq!(r.reg.stats().lost, 0);
        assert_eq!(r.red(4, 4003, false, &["y", "z"], "!"), Outcome::Delivered);
        assert_eq!(r.text, "a\u{feff}xyz!");
    }

    /// A sender restarts its sequence at 40000 and the network swaps its first two packets
    /// (the reordering RFC 4103 5.4 asks a receiver to put right): 40001 "y", 40000 "x",
    /// 40002 "z", 40003 "w". The kept packets make a run whatever their order: "axyzw". (A
    /// run restarted at each packet that was not the one after the last lost "x" and "y"
    /// without a mark.)
    #[test]
    fn a_restart_whose_first_packets_arrive_swapped_loses_no_text() {
        let mut r = Rig::new();
        r.plain(0, 100, true, "a");
        assert_eq!(r.plain(1, 40_001, false, "y"), Outcome::Jump);
        r.plain(2, 40_000, true, "x");
        r.plain(3, 40_002, false, "z");
        r.plain(4, 40_003, false, "w");
        assert_eq!(r.reg.stats().restarts, 1);
        assert_eq!(
            (r.text.as_str(), r.reg.stats().lost),
            ("axyzw", 0),
            "each packet once, in order"
        );
    }

    /// A restart a little behind (three sequential packets needed) whose second packet the
    /// network duplicates: 4000 "p", 4001 "q", 4001 "q", 4002 "r", 4003 "s". The duplicate is
    /// stale, not a new run: "apqrs", each packet's text once.
    #[test]
    fn a_duplicate_inside_a_restart_run_does_not_lose_its_first_packet() {
        let mut r = Rig::new();
        r.plain(0, 5000, true, "a");
        assert_eq!(r.plain(1, 4000, true, "p"), Outcome::Jump);
        assert_eq!(r.plain(2, 4001, false, "q"), Outcome::Jump);
        r.plain(3, 4001, false, "q");
        r.plain(4, 4002, false, "r");
        r.plain(5, 4003, false, "s");
        assert_eq!(r.reg.stats().restarts, 1);
        assert_eq!(
            (r.text.as_str(), r.reg.stats().lost),
            ("apqrs", 0),
            "each packet once, in order"
        );
    }

    /// Late duplicates far behind (as in `two_late_duplicates_far_behind_are_not_a_restart`),
    /// arriving one at a time between live packets: 1050 "A", live 1201 "x", 1051 "B", live
    /// 1202 "y", 1052 ".", live 1203 "z". The live sequence never stopped: no restart (the
    /// kept copies are strays once a live packet is delivered), and "xyz" follows what was
    /// said. (Kept across the live packets, the third duplicate confirmed a restart: "AB."
    /// delivered again, and 1203 waited behind a gap of 150 marked lost.)
    #[test]
    fn late_duplicates_between_live_packets_are_not_a_restart() {
        let (mut r, before) = Rig::live_1000_to_1200();
        r.plain(2000, 1050, false, "A");
        r.plain(2001, 1201, false, "x");
        r.plain(2002, 1051, false, "B");
        r.plain(2003, 1202, false, "y");
        r.plain(2004, 1052, false, ".");
        r.plain(2005, 1203, false, "z");
        r.expire(10_000);
        assert_eq!(&r.text[before.len()..], "xyz");
        assert_eq!(r.reg.stats().restarts, 0);
    }
    /// A sender restarts its sequence at 40000 just after its old packet 101, and the network
    /// swaps the two (the reordering RFC 4103 5.4 asks a receiver to put right): 100 "a",
    /// 40000 "\u{feff}x" (marked, the new session's start), 101 "b", 40001 "y", 40002 "z", all
    /// RED with two generations: "ab\u{feff}xyz". The old sequence going on makes kept packets
    /// strays only for a short jump back (late duplicates); a jump ahead stays kept.
    #[test]
    fn a_restart_overtaking_the_old_sequences_last_packet_keeps_its_first_packet() {
        let mut r = Rig::new();
        r.red(0, 100, true, &["", ""], "a");
        assert_eq!(
            r.red(1, 40_000, true, &["", ""], "\u{feff}x"),
            Outcome::Jump
        );
        assert_eq!(r.red(2, 101, false, &["", "a"], "b"), Outcome::Delivered);
        r.red(3, 40_001, false, &["", "\u{feff}x"], "y");
        r.red(4, 40_002, false, &["\u{feff}x", "y"], "z");
        assert_eq!(r.reg.stats().restarts, 1);
        assert_eq!(
            (r.text.as_str(), r.reg.stats().lost),
            ("ab\u{feff}xyz", 0),
            "the restart's first packet once, in order"
        );
    }

    /// The same `since` rule with nothing but a timer in between: the old sequence waits for
    /// 101 (102 held) when the sender restarts at 40000 "x" (plain T.140); the reorder wait
    /// then gives 101 up ("~c"), moving `expected`; 40001 "y" and 40002 "z" follow: "a~cxyz",
    /// the kept "x" delivered with its run.
    #[test]
    fn a_restart_whose_first_packet_is_kept_across_a_reorder_give_up_keeps_it() {
        let mut r = Rig::new();
        r.plain(0, 100, true, "a");
        assert_eq!(r.plain(10, 102, false, "c"), Outcome::Held);
        assert_eq!(r.plain(20, 40_000, true, "x"), Outcome::Jump);
        r.expire(1_010);
        assert_eq!(r.text, "a~c");
        r.plain(1_100, 40_001, false, "y");
        r.plain(1_400, 40_002, false, "z");
        assert_eq!(r.reg.stats().restarts, 1);
        assert_eq!(
            r.text, "a~cxyz",
            "the kept first packet of the restart is delivered"
        );
    }

    /// Late duplicates far behind arriving one at a time between live packets, as in
    /// `late_duplicates_between_live_packets_are_not_a_restart`, but live 1201 is lost, so
    /// the live packets after it are *held*, not delivered: 1050 "A", live 1202 "x" (held),
    /// 1051 "B", live 1203 "y" (held), 1052 ".", live 1204 "z". The live sequence never
    /// stopped: no restart, one loss mark for 1201, then "xyz". The old sequence's newest
    /// packet received (held ones too) moving makes the kept duplicates strays. (Seen only by
    /// the packets delivered, the three made a run: "AB." delivered again and 151 marks.)
    #[test]
    fn late_duplicates_between_held_live_packets_are_not_a_restart() {
        let (mut r, before) = Rig::live_1000_to_1200();
        r.plain(2000, 1050, false, "A");
        assert_eq!(r.plain(2001, 1202, false, "x"), Outcome::Held);
        r.plain(2002, 1051, false, "B");
        assert_eq!(r.plain(2003, 1203, false, "y"), Outcome::Held);
        r.plain(2004, 1052, false, ".");
        r.plain(2005, 1204, false, "z");
        r.expire(10_000);
        assert_eq!(
            r.reg.stats().restarts,
            0,
            "text: {:?}",
            &r.text[before.len()..]
        );
        assert_eq!(&r.text[before.len()..], "~xyz");
        assert_eq!(r.reg.stats().lost, 1);
    }

    /// A sender restarts at 40000 (RED, two generations) and the restart's first packet,
    /// 40000 "\u{feff}x" (the new session's start), is lost; 40001 carries it as its newest
    /// generation and 40002 as its oldest. A user expects "a\u{feff}xyz", as when a stream's
    /// first packet is lost (its head is taken from the generations when they reach the
    /// session's start, RFC 4103 5.3): the run's head is delivered as a stream's first packet,
    /// with every generation when they reach the session's start (the BOM). (Delivered
    /// primaries only, the session start was silently gone.)
    #[test]
    fn a_restart_whose_first_packet_is_lost_recovers_it_from_redundancy() {
        let mut r = Rig::new();
        r.red(0, 100, true, &["", ""], "a");
        // 40000 "\u{feff}x" lost.
        assert_eq!(
            r.red(1, 40_001, false, &["", "\u{feff}x"], "y"),
            Outcome::Jump
        );
        assert_eq!(
            r.red(2, 40_002, false, &["\u{feff}x", "y"], "z"),
            Outcome::Delivered
        );
        assert_eq!(r.reg.stats().restarts, 1);
        let marked = r.reg.stats().lost > 0;
        assert!(
            r.text == "a\u{feff}xyz" || marked,
            "the restart's lost first packet neither recovered nor marked: {:?}",
            r.text
        );
    }

    /// The same restart counts 40000's text, given back by the run's head's redundancy, as
    /// recovered (`RegisterStats::recovered`: "Lost packets whose text came from a later
    /// packet's redundancy"), as a stream's first packet starting the session by its
    /// redundancy does. The restart's head counted nothing (review, session 35).
    #[test]
    fn a_restarts_lost_first_packet_recovered_from_the_runs_head_is_counted_as_recovered() {
        let mut r = Rig::new();
        r.red(0, 100, true, &["", ""], "a");
        // 40000 "\u{feff}x" lost.
        assert_eq!(
            r.red(300, 40_001, false, &["", "\u{feff}x"], "y"),
            Outcome::Jump
        );
        assert_eq!(
            r.red(600, 40_002, false, &["\u{feff}x", "y"], "z"),
            Outcome::Delivered
        );
        assert_eq!(r.text, "a\u{feff}xyz");
        assert_eq!(r.reg.stats().restarts, 1);
        let mut first = Rig::new();
        first.red(0, 40_001, false, &["", "\u{feff}x"], "y");
        assert_eq!(first.reg.stats().recovered, 1, "a stream's head counts it");
        assert_eq!(r.reg.stats().recovered, 1, "40000's text came from 40001");
    }

    /// A restart whose second packet is lost: 40000 "\u{feff}x" (kept, marked), 40001 lost,
    /// 40002 ["\u{feff}x", "y"] "z", 40003 ["y", "z"] "w" (RED, two generations). The run
    /// believed is 40002..40003; the kept 40000 before it starts a session (marked, the BOM):
    /// it is the restart's head, delivered, and 40001's text comes back from 40002's
    /// redundancy, "a\u{feff}xyzw", once. Nothing is dropped as a stray (review, session 36).
    #[test]
    fn a_restart_with_a_loss_in_its_first_packets_keeps_what_came_before_it() {
        let mut r = Rig::new();
        r.red(0, 100, true, &["", ""], "a");
        assert_eq!(
            r.red(1, 40_000, true, &["", ""], "\u{feff}x"),
            Outcome::Jump
        );
        // 40001 "y" lost.
        r.red(2, 40_002, false, &["\u{feff}x", "y"], "z");
        r.red(3, 40_003, false, &["y", "z"], "w");
        assert_eq!(r.reg.stats().restarts, 1);
        assert_eq!(
            (r.text.as_str(), r.reg.stats().jumps),
            ("a\u{feff}xyzw", 0),
            "what the restart sent, once, in order"
        );
    }

    /// Late duplicates far behind in a plain stream, stamped as they were sent, come together
    /// while the stream is quiet: 5, 6, 7 of a live 1..=120 (RFC 4103 5.1's pace). Stamped
    /// before the last delivered packet and starting no session, they are stale, not a
    /// restart (RFC 3550 A.1's three sequential packets), and the live stream goes on. (Taken
    /// for a restart, their text was said again and the stream moved back; a review found it
    /// in a mixer's stream, `tests/mixer_clock.rs`, review, session 36.)
    #[test]
    fn late_duplicates_stamped_before_the_last_delivered_are_stale_not_a_restart() {
        let (mut r, before) = Rig::paced_1_to_120();
        let got: Vec<Outcome> = (5..=7u16)
            .map(|s| r.stamped(40_000, s, 300 * u32::from(s), false, "old."))
            .collect();
        assert_eq!(got, [Outcome::Jump, Outcome::Jump, Outcome::Stale]);
        assert_eq!(
            r.stamped(40_100, 121, 36_300, false, "w121."),
            Outcome::Delivered
        );
        assert_eq!(&r.text[before.len()..], "w121.");
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.stale, s.jumps), (0, 3, 0));
    }

    /// A plain restart stamped behind the old clock (RFC 3550 5.1: a random new clock) whose
    /// marked first packet, 10, is lost has a late duplicate's header: 11, 12, 13 are dropped
    /// as stale (a known gap, README "Sequence"). Its next marked packet (the first after a
    /// pause, RFC 4103 5.2) starts a session: the run it ends, 14..=16, is believed, and the
    /// stream goes on from it.
    #[test]
    fn a_restart_stamped_behind_without_its_start_is_taken_at_its_next_marked_packet() {
        let (mut r, before) = Rig::paced_1_to_120();
        let mut got = Vec::new();
        for (k, t) in ["a.", "b.", "c.", "d.", "e.", "F."].iter().enumerate() {
            let k16 = k as u16;
            let ts = 9_300 + 300 * k as u32;
            got.push(r.stamped(40_000 + 300 * u64::from(k16), 11 + k16, ts, k == 5, t));
        }
        use Outcome::{Held, Jump, Stale};
        // The run's head, 14, starts no session: the run waits for packets before it.
        assert_eq!(got, [Jump, Jump, Stale, Jump, Jump, Held]);
        assert_eq!(r.stamped(42_000, 17, 11_100, false, "g."), Held);
        r.expire(50_000);
        assert_eq!(&r.text[before.len()..], "d.e.F.g.");
        assert_eq!(r.reg.stats().restarts, 1);
    }
}
