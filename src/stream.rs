//! One received T.140 stream: sequence tracking, RED recovery of gaps, T.140 decoding and
//! chunking. A stream is keyed by SSRC scoped to its source address (RFC 3550 section 8.2:
//! SSRCs are only unique within a session, and we do not trust a remote to pick unique ones).

use std::net::SocketAddr;

use crate::chunker::{Chunk, Chunker, FlushCause};
use crate::red::RedPayload;
use crate::t140::Decoder;
use crate::time::Time;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub source: SocketAddr,
    pub ssrc: u32,
}

impl StreamKey {
    /// Stable participant id derived from the stream: the same sender gets the same id across
    /// gateway restarts, so a PVP session sees one participant per speaker, not one per run.
    pub fn participant_id(&self) -> String {
        format!("t140:{:08x}@{}", self.ssrc, self.source)
    }

    pub fn display_name(&self) -> String {
        format!("T.140 {:08x} ({})", self.ssrc, self.source)
    }

    /// `source` field of context.add (pvp-spec 9.1): where the text came from.
    pub fn source_uri(&self) -> String {
        format!("rtp://{}?ssrc=0x{:08x}", self.source, self.ssrc)
    }
}

/// What happened to one packet's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqOutcome {
    /// In order (or the first packet); `gap` packets were skipped before it.
    Accept { gap: u16 },
    /// A duplicate or a packet older than what was already delivered.
    Stale,
}

/// Per-stream counters, folded into the gateway totals when the stream ends.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    pub packets: u64,
    pub bytes: u64,
    pub stale: u64,
    pub recovered: u64,
    pub lost: u64,
}

/// Gaps wider than this are a sender restart or a jump (RFC 3550 A.1 MAX_DROPOUT), not loss:
/// resynchronise and mark one loss rather than thousands.
const MAX_DROPOUT: u16 = 3000;

#[derive(Debug)]
pub struct Stream {
    pub key: StreamKey,
    pub participant: String,
    /// Creation order, for shutdown flushing in a stable order.
    pub serial: u64,
    pub created: Time,
    pub last_packet: Time,
    /// Last time text changed the buffer; the idle flush counts from here.
    pub last_text: Time,
    /// Deadline this stream has in the timer heap, if any.
    pub timer: Option<Time>,
    pub chunks_sent: u64,
    pub decoder: Decoder,
    pub chunker: Chunker,
    pub stats: StreamStats,
    max_seq: Option<u16>,
}

impl Stream {
    pub fn new(key: StreamKey, serial: u64, now: Time, max_chunk_chars: usize) -> Self {
        Stream {
            key,
            participant: key.participant_id(),
            serial,
            created: now,
            last_packet: now,
            last_text: now,
            timer: None,
            chunks_sent: 0,
            decoder: Decoder::new(),
            chunker: Chunker::new(max_chunk_chars),
            stats: StreamStats::default(),
            max_seq: None,
        }
    }

    /// Unique context key within the session: participant, stream start, counter.
    pub fn next_key(&mut self) -> String {
        self.chunks_sent += 1;
        format!(
            "{}/{}/{}",
            self.participant,
            self.created.as_millis(),
            self.chunks_sent
        )
    }

    /// Sequence check per RFC 3550 A.1 in its simplest form: anything not newer than the
    /// highest delivered sequence number (modulo wrap) is stale.
    pub fn check_sequence(&mut self, seq: u16) -> SeqOutcome {
        let Some(max) = self.max_seq else {
            self.max_seq = Some(seq);
            return SeqOutcome::Accept { gap: 0 };
        };
        let delta = seq.wrapping_sub(max);
        if delta == 0 || delta >= 0x8000 {
            self.stats.stale += 1;
            return SeqOutcome::Stale;
        }
        self.max_seq = Some(seq);
        SeqOutcome::Accept {
            gap: if delta > MAX_DROPOUT { 1 } else { delta - 1 },
        }
    }

    /// Feeds a plain T.140 payload after `gap` lost packets (each marked, RFC 4103 5.3).
    pub fn receive_plain(&mut self, gap: u16, payload: &[u8], now: Time) {
        for _ in 0..gap {
            self.stats.lost += 1;
            self.decoder.mark_loss(&mut self.chunker);
        }
        self.decode(payload, now);
    }

    /// Feeds a RED payload after `gap` lost packets: the lost packets' text is taken from the
    /// redundant generations, placed by counting back sequence numbers (RFC 4103 4.2) rather than
    /// by timestamp offset, which real senders get wrong. What no generation covers is marked.
    pub fn receive_red(&mut self, gap: u16, red: &RedPayload<'_>, now: Time) {
        let gens = red.redundant_count();
        let covered = usize::from(gap).min(gens);
        for _ in covered..usize::from(gap) {
            self.stats.lost += 1;
            self.decoder.mark_loss(&mut self.chunker);
        }
        for block in red.redundant_blocks().skip(gens - covered) {
            self.stats.recovered += 1;
            self.decode(block.data, now);
        }
        self.decode(red.primary().data, now);
    }

    fn decode(&mut self, data: &[u8], now: Time) {
        if !data.is_empty() {
            self.decoder.feed(data, &mut self.chunker);
            self.last_text = now;
        }
    }

    /// Cuts everything buffered (idle, end); an incomplete character at the end of a stream
    /// becomes U+FFFD.
    pub fn flush(&mut self, cause: FlushCause) -> Option<Chunk> {
        if cause == FlushCause::End {
            self.decoder.finish(&mut self.chunker);
        }
        self.chunker.flush(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::red;

    fn stream() -> Stream {
        let key = StreamKey {
            source: "127.0.0.1:4000".parse().unwrap(),
            ssrc: 0xabcdef01,
        };
        Stream::new(key, 0, Time(0), 500)
    }

    #[test]
    fn ids_are_derived_from_the_stream() {
        let s = stream();
        assert_eq!(s.participant, "t140:abcdef01@127.0.0.1:4000");
        let k6 = StreamKey {
            source: "[::1]:5".parse().unwrap(),
            ssrc: 1,
        };
        assert_eq!(k6.participant_id(), "t140:00000001@[::1]:5");
        assert_eq!(k6.source_uri(), "rtp://[::1]:5?ssrc=0x00000001");
    }

    #[test]
    fn sequence_wraps_and_stale_packets_are_refused() {
        let mut s = stream();
        assert_eq!(s.check_sequence(65534), SeqOutcome::Accept { gap: 0 });
        assert_eq!(s.check_sequence(65535), SeqOutcome::Accept { gap: 0 });
        assert_eq!(s.check_sequence(0), SeqOutcome::Accept { gap: 0 });
        assert_eq!(s.check_sequence(0), SeqOutcome::Stale);
        assert_eq!(s.check_sequence(65535), SeqOutcome::Stale);
        assert_eq!(s.check_sequence(3), SeqOutcome::Accept { gap: 2 });
        assert_eq!(s.check_sequence(3 + 5000), SeqOutcome::Accept { gap: 1 });
        assert_eq!(s.stats.stale, 2);
    }

    #[test]
    fn red_recovers_gaps_and_marks_the_rest() {
        let mut s = stream();
        // Packets 1..=5 carry "a".."e", each with two generations. 2 and 3 are lost.
        let mut p = Vec::new();
        red::write_payload(&mut p, 98, &[], b"a");
        let r = RedPayload::parse(&p).unwrap();
        s.check_sequence(1);
        s.receive_red(0, &r, Time(0));
        let mut p = Vec::new();
        red::write_payload(&mut p, 98, &[(600, b"b"), (300, b"c")], b"d");
        let SeqOutcome::Accept { gap } = s.check_sequence(4) else {
            panic!()
        };
        assert_eq!(gap, 2);
        s.receive_red(gap, &RedPayload::parse(&p).unwrap(), Time(0));
        assert_eq!(s.chunker.pending(), "abcd");
        // 5, 6, 7 lost; 8 carries 6 and 7: 5 is marked.
        let mut p = Vec::new();
        red::write_payload(&mut p, 98, &[(600, b"f"), (300, b"g")], b"h");
        let SeqOutcome::Accept { gap } = s.check_sequence(8) else {
            panic!()
        };
        s.receive_red(gap, &RedPayload::parse(&p).unwrap(), Time(0));
        assert_eq!(s.chunker.pending(), "abcd\u{fffd}fgh");
        assert_eq!((s.stats.recovered, s.stats.lost), (4, 1));
    }

    #[test]
    fn plain_loss_is_marked_once_per_lost_packet() {
        let mut s = stream();
        s.check_sequence(10);
        s.receive_plain(0, b"ab", Time(0));
        let SeqOutcome::Accept { gap } = s.check_sequence(13) else {
            panic!()
        };
        s.receive_plain(gap, b"cd", Time(0));
        assert_eq!(s.chunker.pending(), "ab\u{fffd}\u{fffd}cd");
    }
}
