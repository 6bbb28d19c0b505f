//! The sending side of RFC 4103: text in, RTP datagrams out, time passed in as a value.
//!
//! What a speech-to-text pipeline or an RTT terminal does. Like [`crate::gateway::Gateway`] it is
//! sans-IO: the caller queues text with [`Sender::push_text`], drains [`Sender::poll_packet`]
//! until it returns `None`, and sleeps until [`Sender::poll_timeout`]. No socket, clock or task
//! lives here, so tests drive a sender and a gateway together in virtual time.
//!
//! Rules implemented, by section of RFC 4103 (and RFC 2198 for the RED framing):
//! - 3: one T140block per packet, a whole number of UTF-8 characters (never a split character);
//!   RTP timestamps on a 1000 Hz clock, never the same for two packets; sequence numbers +1.
//! - 4 / RFC 2198 section 3: with `redundancy` N > 0 every packet is `text/red` carrying the
//!   primaries of the previous N packets, oldest first, so a receiver can place them by counting
//!   back sequence numbers; a generation with no packet behind it is an empty block.
//! - 5.1: text is buffered for `buffer_time` (300 ms recommended; T.140 allows at most 500 ms) and
//!   packets are never closer than that; text arriving after an idle period goes out at once.
//! - 5.2: with redundancy, packets with an empty primary keep coming every `buffer_time` until
//!   the last text has been sent as every generation, then the sender goes idle. The marker bit
//!   is set on the first packet of the session and on the first packet after an idle period.
//! - 6: `cps` caps the characters sent; it is enforced over every sliding one-second window,
//!   which is at least as strict as the averaging the receiver's `cps` asks for.
//! - T.140: the first text of a session is preceded by U+FEFF (ZERO WIDTH NO-BREAK SPACE).

use std::collections::VecDeque;
use std::time::Duration;

use crate::red;
use crate::rtp;
use crate::time::Time;

/// Sent once, before the first text of the session (T.140); receivers ignore it.
const BOM: &str = "\u{feff}";
/// RFC 2198 section 3: the timestamp offset field is 14 bits.
const MAX_TS_OFFSET: u32 = 0x3fff;
/// RFC 2198 section 3: the block length field is 10 bits.
const MAX_RED_BLOCK: usize = 0x3ff;
/// Datagram size the sender keeps to (primary plus every generation at their largest), well
/// under any path MTU, so text is never IP-fragmented.
pub const MAX_DATAGRAM: usize = 1200;
const RTP_HEADER: usize = 12;
/// A block always has room for the BOM and a few 4-byte characters, whatever `redundancy` says.
const MIN_BLOCK: usize = 16;
const CPS_WINDOW: Duration = Duration::from_secs(1);

/// Sender settings; the `send` subcommand maps its flags onto this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderConfig {
    pub ssrc: u32,
    /// RFC 4103 `text/t140` payload type (dynamic; 98 by convention here).
    pub t140_pt: u8,
    /// RFC 2198 `text/red` payload type (dynamic; 100 by convention here).
    pub red_pt: u8,
    /// 0 = plain `text/t140`; N = `text/red` with N redundant generations (RFC 4103 section 4
    /// recommends 2).
    pub redundancy: u8,
    /// How long text is collected before it is sent (RFC 4103 section 5.1: 300 ms).
    pub buffer_time: Duration,
    /// Characters per second the receiver accepts (RFC 4103 section 6 `cps`); `None` = no cap.
    pub cps: Option<u32>,
    pub initial_seq: u16,
    pub initial_ts: u32,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            ssrc: 0,
            t140_pt: 98,
            red_pt: 100,
            redundancy: 2,
            buffer_time: Duration::from_millis(300),
            cps: None,
            initial_seq: 0,
            initial_ts: 0,
        }
    }
}

/// Counters for logs; plain integers, never reset.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SenderStats {
    pub packets: u64,
    /// Packets whose primary block carried new text.
    pub text_packets: u64,
    /// Characters of queued text sent (the BOM not counted).
    pub chars: u64,
    /// Datagram bytes, RTP header included.
    pub bytes: u64,
}

/// The sans-IO T.140 sender of one RTP stream.
#[derive(Debug)]
pub struct Sender {
    cfg: SenderConfig,
    /// `now` at creation: RTP timestamps count milliseconds from here.
    start: Time,
    /// Largest T140block in bytes, so a packet with every generation full fits [`MAX_DATAGRAM`]
    /// and every block fits the 10-bit RED length.
    block_cap: usize,
    next_seq: u16,
    last_ts: Option<u32>,
    last_send: Option<Time>,
    bom_sent: bool,
    /// Text queued and not yet sent.
    pending: String,
    /// When `pending` last went from empty to non-empty (or was cut by a full block).
    queued_at: Option<Time>,
    /// `(timestamp, primary)` of the last `redundancy` packets, oldest first.
    history: VecDeque<(u32, Vec<u8>)>,
    /// Packets with an empty primary still owed so the last text goes out as every generation.
    redundancy_left: u8,
    /// `(sent at, characters)` of recent packets, for the `cps` window.
    window: VecDeque<(Time, u32)>,
    stats: SenderStats,
}

impl Sender {
    pub fn new(cfg: SenderConfig, now: Time) -> Self {
        let n = usize::from(cfg.redundancy);
        let overhead = RTP_HEADER + if n > 0 { 4 * n + 1 } else { 0 };
        let mut block_cap = MAX_DATAGRAM.saturating_sub(overhead) / (n + 1);
        if n > 0 {
            block_cap = block_cap.min(MAX_RED_BLOCK);
        }
        Sender {
            next_seq: cfg.initial_seq,
            block_cap: block_cap.max(MIN_BLOCK),
            cfg,
            start: now,
            last_ts: None,
            last_send: None,
            bom_sent: false,
            pending: String::new(),
            queued_at: None,
            history: VecDeque::with_capacity(n + 1),
            redundancy_left: 0,
            window: VecDeque::new(),
            stats: SenderStats::default(),
        }
    }

    pub fn config(&self) -> &SenderConfig {
        &self.cfg
    }

    pub fn stats(&self) -> SenderStats {
        self.stats
    }

    /// Queue text typed/recognised at `now` (any UTF-8, controls passed through as-is: backspace
    /// U+0008, U+2028, CR LF).
    pub fn push_text(&mut self, now: Time, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.pending.is_empty() {
            self.queued_at = Some(now);
        }
        self.pending.push_str(text);
    }

    /// True when all queued text and all redundant retransmissions have been sent.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.redundancy_left == 0
    }

    /// When [`Sender::poll_packet`] next has something to send (`None` when idle with nothing
    /// pending).
    pub fn poll_timeout(&self) -> Option<Time> {
        let tick = self
            .last_send
            .map(|l| l.saturating_add(self.cfg.buffer_time));
        if self.pending.is_empty() {
            return if self.redundancy_left > 0 { tick } else { None };
        }
        let queued = self.queued_at.unwrap_or(self.start);
        let due = tick.map_or(queued, |t| t.max(queued));
        if self.redundancy_left > 0 {
            // Redundancy goes out on time; the text rides along as far as `cps` allows.
            return Some(due);
        }
        Some(self.cps_ready_at(due))
    }

    /// Next packet due at or before `now`, as the bytes of a complete RTP datagram; call
    /// repeatedly until `None`.
    pub fn poll_packet(&mut self, now: Time) -> Option<Vec<u8>> {
        if self.poll_timeout()? > now {
            return None;
        }
        self.prune_window(now);
        let marker = self.after_idle();
        let ts = self.timestamp(now);
        let (primary, chars) = self.take_block(now);
        let n = usize::from(self.cfg.redundancy);

        let mut out = Vec::with_capacity(RTP_HEADER + 5 * n + 1 + (n + 1) * primary.len());
        if n == 0 {
            rtp::write_packet(
                &mut out,
                marker,
                self.cfg.t140_pt,
                self.next_seq,
                ts,
                self.cfg.ssrc,
                &primary,
            );
        } else {
            rtp::write_packet(
                &mut out,
                marker,
                self.cfg.red_pt,
                self.next_seq,
                ts,
                self.cfg.ssrc,
                &[],
            );
            let gens = self.generations(ts);
            red::write_payload(&mut out, self.cfg.t140_pt, &gens, &primary);
        }

        if primary.is_empty() {
            self.redundancy_left = self.redundancy_left.saturating_sub(1);
        } else {
            self.redundancy_left = self.cfg.redundancy;
            self.stats.text_packets += 1;
        }
        if n > 0 {
            if self.history.len() == n {
                self.history.pop_front();
            }
            self.history.push_back((ts, primary));
        }
        if chars > 0 {
            self.window.push_back((now, chars));
            self.stats.chars += u64::from(chars);
        }
        // Text left over (a full block, or the `cps` cap) is still available text: it does not
        // start an idle period.
        self.queued_at = (!self.pending.is_empty()).then_some(now);
        self.last_send = Some(now);
        self.last_ts = Some(ts);
        self.next_seq = self.next_seq.wrapping_add(1);
        self.stats.packets += 1;
        self.stats.bytes += out.len() as u64;
        Some(out)
    }

    /// RFC 4103 section 5.2: is the next packet the first after an idle period? Without
    /// redundancy an idle period begins at a transmission tick with no text to send; with it,
    /// once the last text has gone out as every generation.
    fn after_idle(&self) -> bool {
        let Some(last) = self.last_send else {
            return true;
        };
        let Some(queued) = self.queued_at else {
            return false;
        };
        if self.cfg.redundancy == 0 {
            queued > last.saturating_add(self.cfg.buffer_time)
        } else {
            self.redundancy_left == 0 && queued > last
        }
    }

    /// RFC 4103 section 3: 1000 Hz clock from `now`; sequential packets never share a timestamp.
    fn timestamp(&self, now: Time) -> u32 {
        // Truncating to 32 bits is the RTP timestamp wrap.
        let ms = now.saturating_sub(self.start).as_millis() as u32;
        let ts = self.cfg.initial_ts.wrapping_add(ms);
        match self.last_ts {
            Some(last) if (ts.wrapping_sub(last) as i32) <= 0 => last.wrapping_add(1),
            _ => ts,
        }
    }

    /// Cuts the next T140block from the queue: whole characters only, at most `block_cap` bytes
    /// and as many characters as `cps` allows at `now`. The BOM leads the first block.
    fn take_block(&mut self, now: Time) -> (Vec<u8>, u32) {
        let budget = self.cps_budget(now);
        if self.pending.is_empty() || budget == 0 {
            return (Vec::new(), 0);
        }
        let mut block = Vec::new();
        if !self.bom_sent {
            block.extend_from_slice(BOM.as_bytes());
            self.bom_sent = true;
        }
        let room = self.block_cap - block.len();
        let mut end = 0;
        let mut chars = 0u32;
        for c in self.pending.chars() {
            if chars >= budget || end + c.len_utf8() > room {
                break;
            }
            end += c.len_utf8();
            chars += 1;
        }
        block.extend_from_slice(&self.pending.as_bytes()[..end]);
        self.pending.drain(..end);
        (block, chars)
    }

    /// The redundant generations of a packet stamped `ts`, oldest first (RFC 2198 section 3).
    /// Generation k is the primary of the packet k sequence numbers back. A generation with no
    /// packet behind it, or one too old for the 14-bit offset, is an empty block; its offset is
    /// a plausible one (k buffer times), kept non-increasing toward the primary.
    fn generations(&self, ts: u32) -> Vec<(u16, &[u8])> {
        let n = usize::from(self.cfg.redundancy);
        let step = self
            .cfg
            .buffer_time
            .as_millis()
            .min(u128::from(MAX_TS_OFFSET)) as u32;
        let mut gens = Vec::with_capacity(n);
        let mut newer = 0u32;
        for k in 1..=n {
            let block = self
                .history
                .len()
                .checked_sub(k)
                .map(|i| &self.history[i])
                .map(|(bts, data)| (ts.wrapping_sub(*bts), data.as_slice()))
                .filter(|(offset, _)| *offset <= MAX_TS_OFFSET);
            let (offset, data) = block.unwrap_or_else(|| {
                let placeholder = (newer + 1).max(step.saturating_mul(k as u32));
                (placeholder.min(MAX_TS_OFFSET), &[][..])
            });
            newer = offset;
            gens.push((offset as u16, data));
        }
        gens.reverse();
        gens
    }

    /// Characters `cps` still allows in a packet sent at `at` (RFC 4103 section 6).
    fn cps_budget(&self, at: Time) -> u32 {
        let Some(cps) = self.cfg.cps else {
            return u32::MAX;
        };
        cps.max(1).saturating_sub(self.window_used(at))
    }

    fn window_used(&self, at: Time) -> u32 {
        self.window
            .iter()
            .filter(|(t, _)| t.saturating_add(CPS_WINDOW) > at)
            .map(|(_, c)| *c)
            .sum()
    }

    /// The earliest moment at or after `at` when `cps` allows at least one character.
    fn cps_ready_at(&self, at: Time) -> Time {
        let Some(cps) = self.cfg.cps else {
            return at;
        };
        let limit = cps.max(1);
        let mut used = self.window_used(at);
        if used < limit {
            return at;
        }
        for (t, c) in &self.window {
            let leaves = t.saturating_add(CPS_WINDOW);
            if leaves <= at {
                continue;
            }
            used -= c;
            if used < limit {
                return leaves;
            }
        }
        at
    }

    /// Forgets `cps` window entries that no longer count at `now` or later.
    fn prune_window(&mut self, now: Time) {
        while self
            .window
            .front()
            .is_some_and(|(t, _)| t.saturating_add(CPS_WINDOW) <= now)
        {
            self.window.pop_front();
        }
    }
}
