//! One received RTP stream: its receive register and its speakers. A stream is keyed by SSRC
//! scoped to its source address (RFC 3550 section 8.2: SSRCs are only unique within a session,
//! and we do not trust a remote to pick unique ones).

use std::net::SocketAddr;

use crate::red::RedFormat;
use crate::register::Register;
use crate::speaker::{Speaker, VoiceRef};
use crate::time::Time;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamKey {
    pub source: SocketAddr,
    pub ssrc: u32,
}

/// Two word writes instead of the derived walk over `SocketAddr`'s enum, octets and port: the
/// stream index is looked up once per datagram. Equal keys hash equal (IPv6 flow info and scope
/// only take part in `Eq`).
impl std::hash::Hash for StreamKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let ip = match self.source.ip() {
            std::net::IpAddr::V4(a) => u128::from(a.to_bits()),
            std::net::IpAddr::V6(a) => a.to_bits(),
        };
        h.write_u128(ip);
        h.write_u64(u64::from(self.source.port()) << 32 | u64::from(self.ssrc));
    }
}

/// The stream index's hasher: keys are chosen by remote senders, so it is seeded per process
/// (foldhash: fast on small keys, and seeded against hash flooding); the table is bounded by
/// `--max-streams` as well.
///
/// A wrapper only to inline `hash_one` always: the packet path's lookup hashes a key in a few
/// instructions, and the provided `hash_one` was inlined or called as unrelated code moved
/// (callgrind, 1 stream: 10 instructions a packet when called).
#[derive(Debug, Clone, Default)]
pub struct KeyHasher(foldhash::fast::RandomState);

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = foldhash::fast::FoldHasher<'static>;

    #[inline(always)]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }

    // Not the provided method: the point is the attribute.
    #[allow(clippy::manual_hash_one)]
    #[inline(always)]
    fn hash_one<T: std::hash::Hash>(&self, x: T) -> u64 {
        use std::hash::Hasher;
        let mut h = self.build_hasher();
        x.hash(&mut h);
        h.finish()
    }
}

/// A stream's speakers: one (inline) unless a mixer or multiplexer carries several.
pub type Speakers = smallvec::SmallVec<[Speaker; 1]>;

impl StreamKey {
    /// Stable participant id derived from the stream: the same sender gets the same id across
    /// gateway restarts, so a PVP session sees one participant per speaker, not one per run.
    pub fn participant_id(&self) -> String {
        let mut s = String::with_capacity(40);
        s.push_str("t140:");
        s.push_str(Hex8::new(self.ssrc).as_str());
        s.push('@');
        SourceText(&self.source).push_to(&mut s);
        s
    }

    /// `T.140 SSRC (ADDR)`: made from the participant id's parts.
    pub fn display_name(&self) -> String {
        self.participant_id_and_name().1
    }

    /// [`StreamKey::participant_id`] and [`StreamKey::display_name`] together, the address
    /// spelled once: the name is made of the id's parts (`t140:SSRC@ADDR` gives
    /// `T.140 SSRC (ADDR)`).
    pub fn participant_id_and_name(&self) -> (String, String) {
        let id = self.participant_id();
        // The SSRC's hex digits hold no `@`: the first one ends them.
        let (ssrc, source) = id
            .strip_prefix("t140:")
            .and_then(|rest| rest.split_once('@'))
            .unwrap_or_default();
        let mut name = String::with_capacity(id.len() + 3);
        name.push_str("T.140 ");
        name.push_str(ssrc);
        name.push_str(" (");
        name.push_str(source);
        name.push(')');
        (id, name)
    }

    /// `source` field of context.add (pvp-spec 9.1): where the text came from.
    pub fn source_uri(&self) -> String {
        SourceUri(*self).to_string()
    }
}

/// The address a source is known by. A dual-stack listener (`--listen [::]:5004`) reports
/// IPv4 senders as v4-mapped IPv6 addresses (`[::ffff:10.0.0.1]:4000`, RFC 4291 section
/// 2.5.5.2); the gateway takes them as the IPv4 addresses they are, so `--allow 10.0.0.0/8`
/// and a mapping rule's IPv4 network match them, a sender's participant id does not depend on
/// which listener it reached, and the stream index keeps them in its packed IPv4 map. Applied
/// where a stream is opened, RTCP arrives, an address is checked against the allow list, and
/// the index meets an IPv6 key, not to every packet: on the packet path it cost 6 instructions a packet
/// with 10,000 streams (callgrind, `core_drive 10000 plain N shuffled warm`).
#[inline]
pub fn canonical(source: SocketAddr) -> SocketAddr {
    match source {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), a.port()),
            None => source,
        },
        v4 => v4,
    }
}

/// [`StreamKey::source_uri`] to be formatted in place (into an envelope's JSON).
pub struct SourceUri(pub StreamKey);

impl std::fmt::Display for SourceUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("rtp://")?;
        SourceText(&self.0.source).fmt(f)?;
        f.write_str("?ssrc=0x")?;
        f.write_str(Hex8::new(self.0.ssrc).as_str())
    }
}

/// A source address spelled as its `Display` spells it, in pieces (without its padding: no
/// caller asks for a width). A new stream spelled its address four times (participant id,
/// display name, source URI, join metadata), and `core::fmt` took about 1,000 instructions
/// each time for an IPv4 address, through its padding machinery for every octet: 10,000
/// streams starting together spent 40 million instructions on it. IPv4 is spelled by hand;
/// IPv6 (scope ids, embedded IPv4, zero runs) goes through `Display` still.
#[derive(Clone, Copy)]
pub struct SourceText<'a>(pub &'a SocketAddr);

impl SourceText<'_> {
    /// Calls `put` with each piece of an IPv4 address's text, in order; stops at its first
    /// error.
    fn spell_v4<E>(
        addr: &std::net::SocketAddrV4,
        mut put: impl FnMut(&str) -> Result<(), E>,
    ) -> Result<(), E> {
        let [a, b, c, d] = addr.ip().octets();
        let mut n = itoa::Buffer::new();
        put(n.format(a))?;
        for octet in [b, c, d] {
            put(".")?;
            put(n.format(octet))?;
        }
        put(":")?;
        put(n.format(addr.port()))
    }

    /// Appends the text to `out`.
    pub fn push_to(self, out: &mut String) {
        match self.0 {
            SocketAddr::V4(a) => {
                let _ = Self::spell_v4(a, |p| {
                    out.push_str(p);
                    Ok::<(), ()>(())
                });
            }
            SocketAddr::V6(_) => {
                use std::fmt::Write;
                // Writing to a String cannot fail.
                let _ = write!(out, "{}", self.0);
            }
        }
    }
}

impl std::fmt::Display for SourceText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            SocketAddr::V4(a) => Self::spell_v4(a, |p| f.write_str(p)),
            SocketAddr::V6(_) => std::fmt::Display::fmt(self.0, f),
        }
    }
}

/// An SSRC or CSRC as eight lowercase hex digits (`{:08x}`), on the stack.
#[derive(Clone, Copy)]
pub struct Hex8([u8; 8]);

impl Hex8 {
    pub fn new(v: u32) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 8];
        for (i, d) in out.iter_mut().enumerate() {
            *d = DIGITS[(v >> (28 - 4 * i) & 0xf) as usize];
        }
        Hex8(out)
    }

    pub fn as_str(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for Hex8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Speakers one stream may carry; more are spoken for by the stream's own voice.
pub const MAX_SPEAKERS: usize = 32;

/// `repr(C)`, hot fields first: with thousands of streams each packet finds its stream cold in
/// the cache, and a packet should touch as few of its lines as it can. An in-order packet reads
/// the clock and counters, the register's head and the inline first speaker's hot part
/// (its chunker, idle clock and decoder), all within the first two lines (a test holds this);
/// the register's held packets and counters (boxed), the speaker's voice and profile, the
/// creation time, key and serial, read only when a speaker is created, a chunk is sent or the
/// stream ends, follow. Aligned to a cache line, so every stream has the same layout in lines
/// (callgrind, 10,000 streams: 10.6 -> 8.8 last-level misses a packet with four lines, 6.1 with
/// three and no cold load ahead of its test; docs/performance.md, section 18, for two).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Stream {
    pub last_packet: Time,
    /// Packets received, for the log line at the stream's end.
    pub packets: u64,
    pub format: RedFormat,
    /// Index of the speaker that is the stream's own voice ([`VoiceRef::Ssrc`]), or
    /// [`NO_SPEAKER`]: the common packet finds its speaker without reading a voice, which sits
    /// in the speaker's cold part.
    pub own: u8,
    /// The source's BYE came: the stream lingers for the reorder wait from it, for packets the
    /// BYE may have overtaken (RFC 3550 6.3.7), then ends. Where and when the BYE came is kept
    /// in the register ([`crate::register::Register::mark_bye`]): a `u16` here moved the
    /// speaker's hot part across a cache line.
    pub bye_waits: bool,
    /// What only a mixer's stream uses, kept together so the packet path carries one
    /// reference to it.
    pub mixer: Mixer,
    pub register: Register,
    /// In creation order; index is the register tag.
    /// The first speaker lives inline: one stream is one block of memory on the packet path.
    pub speakers: Speakers,
    pub created: Time,
    pub key: StreamKey,
    /// Creation order, for shutdown flushing in a stable order.
    pub serial: u64,
    /// Where a mixer's unplaced losses ([`Mixer::unplaced`]) lie on its clock, read only while
    /// there are any: here, in the cold tail, not in [`Mixer`].
    pub unplaced_at: Unplaced,
}

/// A mixer stream's state across its speakers (RFC 9071).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Mixer {
    /// Lost packets no speaker has accounted for yet (placement by timestamp,
    /// [`crate::speaker::Output::unplaced`]), where [`Stream::unplaced_at`] says; let go once
    /// no redundancy can reach back to them.
    pub unplaced: u16,
    /// Speakers whose leave waits after their BYE ([`crate::speaker::MixerVoice::bye_at`]):
    /// none, nearly always, and then no packet looks.
    pub byes: u8,
    /// A source of it that had joined left (its BYE, or its place taken at the speaker bound):
    /// the stream carried text though no speaker may be joined now, and is not evicted as a
    /// stream that never did (README "Stream limit"). Set where a source leaves, never on
    /// the packet path.
    pub spoke: bool,
}

/// Where a mixer stream's lost packets that no speaker accounted for yet lie on its one clock
/// (RFC 9071 section 4): after what the stream delivered before the oldest of them, up to the
/// packet after the newest.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unplaced {
    /// The newest timestamp the stream delivered before the oldest (none: nothing yet).
    pub after: Option<u32>,
    /// The timestamp of the packet that followed the newest.
    pub until: u32,
}

impl Mixer {
    /// Lets go of the losses no speaker accounted for: no later packet will reach back to them
    /// (the stream or its record ends, or RED's reach is past), so they were an idle tail
    /// (RFC 4103 5.2, README "Loss"). Returns how many, for `idle_tail`.
    pub fn let_go_unplaced(&mut self) -> u64 {
        u64::from(std::mem::take(&mut self.unplaced))
    }
}

/// [`Stream::own`] before the stream's own speaker exists.
pub const NO_SPEAKER: u8 = u8::MAX;
const _: () = assert!(MAX_SPEAKERS < NO_SPEAKER as usize);

impl Stream {
    pub fn new(
        key: StreamKey,
        serial: u64,
        now: Time,
        format: RedFormat,
        assume_start: bool,
    ) -> Self {
        Stream {
            key,
            serial,
            created: now,
            last_packet: now,
            own: NO_SPEAKER,
            bye_waits: false,
            mixer: Mixer::default(),
            packets: 0,
            register: Register::with_sender(format, assume_start),
            format,
            // One speaker is the rule; room for exactly one keeps an idle stream small
            // (an empty Vec grows to 4 on its first push).
            speakers: Speakers::new(),
            unplaced_at: Unplaced::default(),
        }
    }

    /// Loads the stream's two hot lines (the first: clock, register head, which speaker is its
    /// own; the second: that speaker's chunker, idle clock and decoder), and folds them into
    /// one, for [`crate::Gateway::warm`]. Also returns the own speaker: its chunker holds the
    /// text buffer's address, which `warm` follows once these lines have arrived.
    #[inline]
    pub fn touch(&self) -> (u64, Option<&Speaker>) {
        let own = self.speakers.get(usize::from(self.own));
        let v = own.map_or(0, |s| s.last_text.0);
        (self.last_packet.0 ^ v, own)
    }

    /// The speaker for `voice`, and whether it is new (and must join). Beyond
    /// [`MAX_SPEAKERS`] the stream's own voice speaks for the rest.
    pub fn speaker(&mut self, voice: VoiceRef<'_>, now: Time) -> (usize, bool) {
        let before = self.speakers.len();
        let i = speaker_index(&mut self.speakers, &mut self.own, &self.key, voice, now);
        (i, self.speakers.len() > before)
    }
}

/// The index of `voice` among a stream's speakers, creating it on first use. Beyond
/// [`MAX_SPEAKERS`] the stream's own voice speaks for the rest. A free function so the gateway
/// can call it while the stream's register is borrowed. Looked up once per packet, so the
/// lookup is inlined and borrows; a new speaker (which owns its voice) is made out of line.
/// The stream's own voice is found by `own` ([`Stream::own`]) once it exists.
#[inline]
pub fn speaker_index(
    speakers: &mut Speakers,
    own: &mut u8,
    key: &StreamKey,
    voice: VoiceRef<'_>,
    now: Time,
) -> usize {
    if voice == VoiceRef::Ssrc && *own != NO_SPEAKER {
        return usize::from(*own);
    }
    match speakers.iter().position(|s| s.voice.as_ref() == voice) {
        Some(i) => i,
        None => new_speaker(speakers, own, key, voice, now),
    }
}

/// Makes `voice`'s speaker, or past [`MAX_SPEAKERS`] finds or makes the stream's own voice.
/// The own voice is recorded in `own` whichever voice asked for it: `make_room` never takes
/// its place (README, "A stream keeps at most 32 speakers"), so the speakers stay at most
/// MAX_SPEAKERS + 1, and, never removed, keep their indices.
#[cold]
fn new_speaker(
    speakers: &mut Speakers,
    own: &mut u8,
    key: &StreamKey,
    voice: VoiceRef<'_>,
    now: Time,
) -> usize {
    let voice = if speakers.len() >= MAX_SPEAKERS {
        if *own != NO_SPEAKER {
            return usize::from(*own);
        }
        VoiceRef::Ssrc
    } else {
        voice
    };
    speakers.push(Speaker::new(voice.to_voice(), key, now));
    let i = speakers.len() - 1;
    if voice == VoiceRef::Ssrc {
        *own = i as u8;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speaker::Voice;

    fn stream() -> Stream {
        let k = StreamKey {
            source: "127.0.0.1:4000".parse().unwrap(),
            ssrc: 1,
        };
        Stream::new(k, 0, Time(0), RedFormat::Rfc2198, false)
    }

    #[test]
    fn ids_are_derived_from_the_stream() {
        let k = StreamKey {
            source: "127.0.0.1:4000".parse().unwrap(),
            ssrc: 0xabcdef01,
        };
        assert_eq!(k.participant_id(), "t140:abcdef01@127.0.0.1:4000");
        assert_eq!(
            Voice::Csrc(2).participant_id(&k),
            "t140:abcdef01@127.0.0.1:4000/csrc:00000002"
        );
        assert_eq!(
            Voice::Named("bob".into()).participant_id(&k),
            "t140:abcdef01@127.0.0.1:4000/bob"
        );
        let k6 = StreamKey {
            source: "[::1]:5".parse().unwrap(),
            ssrc: 1,
        };
        assert_eq!(k6.participant_id(), "t140:00000001@[::1]:5");
        assert_eq!(k6.source_uri(), "rtp://[::1]:5?ssrc=0x00000001");
        // Made together, the id and name are the ones made apart, for every voice.
        for key in [k, k6] {
            for voice in [Voice::Ssrc, Voice::Csrc(2), Voice::Named("bob".into())] {
                assert_eq!(
                    voice.id_and_name(&key),
                    (voice.participant_id(&key), voice.display_name(&key))
                );
            }
        }
        assert_eq!(k.display_name(), "T.140 abcdef01 (127.0.0.1:4000)");
        assert_eq!(k6.display_name(), "T.140 00000001 ([::1]:5)");
    }

    /// The hand-spelled address and hex digits match what `Display` and `{:08x}` write, at
    /// the edges of every field.
    #[test]
    fn source_text_and_hex8_spell_as_display_does() {
        let addrs = [
            "0.0.0.0:0",
            "1.2.3.4:5",
            "10.0.0.1:5004",
            "99.100.109.110:9999",
            "255.255.255.255:65535",
            "[::1]:5",
            "[fe80::1%3]:5004",
            "[::ffff:10.0.0.1]:80",
            "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535",
        ];
        for a in addrs {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(SourceText(&addr).to_string(), addr.to_string(), "{a}");
            let mut pushed = String::from("x");
            SourceText(&addr).push_to(&mut pushed);
            assert_eq!(pushed, format!("x{addr}"), "{a}");
        }
        for v in [0, 1, 0xf, 0x10, 0xabcdef01, 0x8000_0000, u32::MAX] {
            assert_eq!(Hex8::new(v).as_str(), format!("{v:08x}"));
            assert_eq!(Hex8::new(v).to_string(), format!("{v:08x}"));
        }
    }

    /// An in-order packet reads the stream's header, the register's head and its first
    /// speaker's hot part: they must stay within two cache lines.
    #[test]
    fn the_packet_path_fits_in_two_cache_lines() {
        let mut s = stream();
        s.speaker(VoiceRef::Ssrc, Time(0));
        let base = &s as *const Stream as usize;
        let speaker = &s.speakers[0] as *const Speaker as usize - base;
        let register_end = std::mem::offset_of!(Stream, register) + Register::HOT_BYTES;
        assert!(
            register_end <= speaker,
            "the speaker follows the register's head"
        );
        let end = speaker + Speaker::HOT_BYTES;
        assert!(end <= 2 * 64, "the speaker's hot part ends at byte {end}");
        // The speakers vector's own word (its length or capacity, read by every lookup of the
        // inline speaker) sits before or after the inline speaker, as the compiler lays it out:
        // after it, it took another line (callgrind, 10,000 streams: 5.66 -> 6.77 misses a
        // packet, when the speaker shrank by 8 bytes; docs/performance.md, section 13).
        let vec_at = std::mem::offset_of!(Stream, speakers);
        let word = if speaker == vec_at {
            vec_at + std::mem::size_of::<Speaker>()
        } else {
            vec_at
        };
        assert!(
            word + 8 <= 2 * 64,
            "the speakers vector's word sits at byte {word}"
        );
        assert_eq!(
            std::mem::size_of::<Speakers>(),
            std::mem::size_of::<Speaker>() + 8
        );
        assert_eq!(std::mem::align_of::<Stream>(), 64);
    }

    #[test]
    fn the_own_speaker_is_found_by_index() {
        let mut s = stream();
        assert_eq!(s.own, NO_SPEAKER);
        // A mixer's speaker first: the stream's own voice comes second.
        assert_eq!(s.speaker(VoiceRef::Csrc(7), Time(0)), (0, true));
        assert_eq!(s.own, NO_SPEAKER);
        assert_eq!(s.speaker(VoiceRef::Ssrc, Time(0)), (1, true));
        assert_eq!(s.own, 1);
        assert_eq!(s.speaker(VoiceRef::Ssrc, Time(0)), (1, false));
        assert_eq!(s.speakers[1].voice, Voice::Ssrc);
        // Past the bound the own voice speaks for the rest, and is found where it is.
        for c in 0..100 {
            s.speaker(VoiceRef::Csrc(c), Time(0));
        }
        assert_eq!(s.own, 1);
        assert_eq!(s.speaker(VoiceRef::Csrc(1000), Time(0)), (1, false));
    }

    #[test]
    fn speakers_are_bounded() {
        let mut s = stream();
        assert_eq!(s.speaker(VoiceRef::Ssrc, Time(0)), (0, true));
        assert_eq!(s.speaker(VoiceRef::Ssrc, Time(0)), (0, false));
        for c in 0..100 {
            s.speaker(VoiceRef::Csrc(c), Time(0));
        }
        assert_eq!(s.speakers.len(), MAX_SPEAKERS);
    }
}
