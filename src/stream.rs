//! One received T.140 stream: sequence tracking, RED recovery of gaps, T.140 decoding and
//! chunking. A stream is keyed by SSRC scoped to its source address (RFC 3550 section 8.2:
//! SSRCs are only unique within a session, and we do not trust a remote to pick unique ones).

use std::net::SocketAddr;

use std::time::Duration;

use crate::chunker::{Chunk, Chunker, FlushCause};
use crate::red::RedError;
use crate::register::{Outcome, Piece, Register};
use crate::t140::Decoder;
use crate::time::Time;

fn feed(
    decoder: &mut Decoder,
    chunker: &mut Chunker,
    last_text: &mut Time,
    now: Time,
    p: Piece<'_>,
) {
    match p {
        Piece::Text([]) => return,
        Piece::Text(t) => decoder.feed(t, chunker),
        Piece::Lost => decoder.mark_loss(chunker),
    }
    *last_text = now;
}

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

/// Per-stream counters, folded into the gateway totals when the stream ends.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug)]
pub struct Stream {
    pub key: StreamKey,
    pub participant: String,
    /// Display name: derived from the stream until RTCP SDES gives a CNAME (rank 1) or NAME (2).
    pub name: String,
    pub name_rank: u8,
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
    pub register: Register,
    /// Number and content of the last chunk sent (0: none or removed): a backspace reaching past
    /// the buffer corrects it. The buffer is reused, so remembering costs a copy, not an
    /// allocation, per chunk.
    pub last_sent: u64,
    pub last_sent_text: String,
}

impl Stream {
    pub fn new(key: StreamKey, serial: u64, now: Time, max_chunk_chars: usize) -> Self {
        Stream {
            key,
            participant: key.participant_id(),
            name: key.display_name(),
            name_rank: 0,
            serial,
            created: now,
            last_packet: now,
            last_text: now,
            timer: None,
            chunks_sent: 0,
            decoder: Decoder::new(),
            chunker: Chunker::new(max_chunk_chars),
            stats: StreamStats::default(),
            register: Register::new(),
            last_sent: 0,
            last_sent_text: String::new(),
        }
    }

    /// Unique context key within the session: participant, stream start, counter.
    pub fn next_key(&mut self) -> String {
        self.chunks_sent += 1;
        self.key(self.chunks_sent)
    }

    /// The context key of this stream's `n`th chunk.
    pub fn key(&self, n: u64) -> String {
        format!("{}/{}/{}", self.participant, self.created.as_millis(), n)
    }

    /// One RTP payload (plain T.140 or RED) through the register into the decoder and chunker.
    pub fn receive(
        &mut self,
        now: Time,
        seq: u16,
        marker: bool,
        red: bool,
        payload: &[u8],
    ) -> Result<Outcome, RedError> {
        let Stream {
            register,
            decoder,
            chunker,
            last_text,
            ..
        } = self;
        register.receive(now, seq, marker, red, payload, &mut |p| {
            feed(decoder, chunker, last_text, now, p)
        })
    }

    /// Gives up gaps whose reorder wait has expired.
    pub fn expire(&mut self, now: Time, wait: Duration) {
        let Stream {
            register,
            decoder,
            chunker,
            last_text,
            ..
        } = self;
        register.expire(now, wait, &mut |p| {
            feed(decoder, chunker, last_text, now, p)
        });
    }

    /// The stream ends: held packets are given up (recovered or marked) and an incomplete
    /// character becomes U+FFFD. Chunks this cuts wait in the chunker for the caller.
    pub fn finish_input(&mut self) {
        let now = self.last_packet;
        let Stream {
            register,
            decoder,
            chunker,
            last_text,
            ..
        } = self;
        register.finish(&mut |p| feed(decoder, chunker, last_text, now, p));
        decoder.finish(chunker);
    }

    /// Cuts everything buffered (idle, end).
    pub fn flush(&mut self, cause: FlushCause) -> Option<Chunk> {
        self.chunker.flush(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
