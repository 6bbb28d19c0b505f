//! Reads UDP datagrams out of pcap and pcapng captures (IO shell, used by `replay`).
//!
//! pcap-parser reads both container formats and strips the link layer (Ethernet, Linux cooked
//! SLL/SLL2, raw IP, BSD loopback); etherparse decodes the IPv4/IPv6 and UDP headers.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use etherparse::defrag::{IpDefragBuf, IpFragRange};
use etherparse::{
    IpFragOffset, IpNumber, Ipv6ExtensionSlice, LaxNetSlice, LaxSlicedPacket, LinkExtSlice,
    NetSlice, SlicedPacket, TransportSlice, UdpHeader, UdpSlice,
};
use pcap_parser::data::{PacketData, get_packetdata};
use pcap_parser::pcapng::{Block, InterfaceDescriptionBlock, OptionCode};
use pcap_parser::{Linktype, PcapBlockOwned, PcapError, create_reader};

use crate::time::Time;

/// A UDP datagram as captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub time: Time,
    pub source: SocketAddr,
    pub destination: SocketAddr,
    pub payload: Vec<u8>,
}

/// What one packet record of a capture gave ([`read_frames`]), and the interface it was
/// captured on (the pcapng interface, 0 in a pcap): interfaces may stamp apart, so each has
/// its own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A UDP datagram: a whole one, or the one this fragment completed.
    Udp(Datagram, usize),
    /// A record with a timestamp that gave no datagram (not UDP, a fragment of one still
    /// incomplete, cut short...): only its capture time.
    Other(Time, usize),
}

impl Frame {
    /// When it was captured.
    pub fn time(&self) -> Time {
        match self {
            Frame::Udp(d, _) => d.time,
            Frame::Other(t, _) => *t,
        }
    }

    /// The interface it was captured on.
    pub fn interface(&self) -> usize {
        match self {
            Frame::Udp(_, i) | Frame::Other(_, i) => *i,
        }
    }
}

/// What a capture held besides the datagrams we use, and what became of its IP fragments.
///
/// Every frame is counted once in `frames` and once in `skipped`, in `fragments`, or (a whole
/// datagram) in `udp`: `frames == udp - reassembled + skipped + fragments`. Every reassembly
/// ends once, in `reassembled`, `reassembly_timeouts`, `reassembly_evicted`,
/// `reassembly_invalid` or `reassembly_unfinished`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CaptureStats {
    pub frames: u64,
    /// Datagrams handed out: whole ones, and those reassembled from fragments.
    pub udp: u64,
    /// Frames that are not UDP over IP (ARP, TCP, ICMP, fragments of those, UDP behind IPv6
    /// extension headers that follow a fragment header, unsupported link types), or whose
    /// datagram or fragment the snap length cut short.
    pub skipped: u64,
    /// Of `skipped`, the frames whose UDP datagram (or fragment of one) the snap length cut
    /// short: text lost to how the capture was taken, not traffic replay has no use for.
    pub cut_by_snaplen: u64,
    /// Of `skipped`, the frames captured whole whose UDP datagram (or fragment of one) is not
    /// valid UDP over IP: a UDP Length past its IP packet, or under 8 over IPv4, or an IP
    /// length past the frame. The receiving host's stack drops them (Linux `__udp4_lib_rcv`,
    /// `__udp6_lib_rcv`): the live gateway never read them.
    pub udp_malformed: u64,
    /// Of `skipped`, the packet records on an interface their pcapng section did not describe
    /// (no Interface Description Block for it: a corrupt capture, which Wireshark refuses),
    /// or an obsolete Packet Block too short for what it claims: no link type nor time unit
    /// to read them by.
    pub no_interface: u64,
    /// Of `skipped`, the frames of a link type replay does not read (NFLOG, 802.11, PPP...):
    /// a capture of one replays to nothing, and says why.
    pub unsupported_link: u64,
    /// The link type of the first of those (a pcapng's interfaces may have several).
    pub unsupported_link_type: Option<u16>,
    /// Frames that are IPv4 or IPv6 fragments of a UDP datagram, whatever became of them.
    pub fragments: u64,
    /// Datagrams reassembled from fragments (also counted in `udp`).
    pub reassembled: u64,
    /// Fragments repeating bytes a reassembly already held (a capture on two interfaces, a
    /// retransmitting link): dropped, and the reassembly goes on (RFC 8200 section 4.5).
    pub fragments_duplicate: u64,
    /// Reassemblies still missing fragments when their time ran out, in their interface's
    /// capture time as replay takes it, or when that clock was set back: how long they
    /// have waited then cannot be told, and a datagram that came after could take the
    /// identification of one given up long ago.
    pub reassembly_timeouts: u64,
    /// Reassemblies dropped, oldest first, to keep within the bounds on pending reassemblies and
    /// their bytes.
    pub reassembly_evicted: u64,
    /// Reassemblies dropped for a fragment that overlaps another with different bytes,
    /// contradicts where the datagram ends, is empty, is misaligned (IPv6; a non-last IPv4
    /// fragment is cut to a multiple of 8 bytes, as Linux does), or takes the datagram past
    /// 65,535 bytes, or whose datagram is not valid UDP (its Length, or a checksum other than
    /// 0 that is wrong: fragments of two datagrams that shared an identification); the later
    /// fragments start a new one.
    pub reassembly_invalid: u64,
    /// Reassemblies still missing fragments when the capture, or its pcapng section, ended.
    pub reassembly_unfinished: u64,
    /// The file ended inside a record (a capture still being written, or its writer killed):
    /// every whole record before it was read, as Wireshark reads such a file.
    pub cut_short: bool,
}

#[derive(Debug)]
pub enum CaptureError {
    /// Opening or reading the file failed: the I/O error itself.
    Io(io::Error),
    /// The bytes are not a capture replay can read.
    Format(String),
    /// A record the reader cannot parse (a bit flip, a bad copy) after `after` packet records
    /// that it read: the capture is readable up to it.
    Corrupt { after: u64, detail: String },
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Io(e) => write!(f, "{e}"),
            CaptureError::Format(e) => write!(f, "not a readable pcap/pcapng capture: {e}"),
            CaptureError::Corrupt { after, detail } => write!(
                f,
                "a corrupt record after the first {after} packet records, which were read: {detail}"
            ),
        }
    }
}

impl std::error::Error for CaptureError {}

/// Reads every UDP datagram of a capture, in file order, calling `each` for each one.
pub fn read_udp(path: &Path, mut each: impl FnMut(Datagram)) -> Result<CaptureStats, CaptureError> {
    let file = File::open(path).map_err(CaptureError::Io)?;
    read_udp_from(file, &mut each)
}

/// As [`read_udp`], but calls `each` once for every packet record that has a timestamp, in
/// file order: with its datagram, or with only its time. Replay's clock moves on every one,
/// so the time a capture covers passes whatever its frames hold. A pcapng Simple Packet
/// Block, which has no timestamp, is a packet of the section's first interface taken at that
/// interface's previous packet's time (else the section's last packet's, else 0): its
/// datagram is replayed and no time passes for it. A record on an interface the section did
/// not describe gives nothing. `each` returning `Break` ends the reading there (replay's output
/// failed: the rest of the capture would be read for nothing).
pub fn read_frames(
    path: &Path,
    mut each: impl FnMut(Frame) -> ControlFlow<()>,
) -> Result<CaptureStats, CaptureError> {
    let file = File::open(path).map_err(CaptureError::Io)?;
    read_frames_from(file, &mut each)
}

/// The reader's buffer to start with: every datagram an Ethernet capture holds fits.
const INITIAL_BUFFER: usize = 1 << 16;

/// The most the reader's buffer grows to. A record (a frame, or any pcapng block) must fit in
/// it whole: Linux loopback's 65536-byte MTU makes frames just over 64 KiB, so the buffer
/// grows for them, but a record this big is a corrupt length, not a packet.
const MAX_BUFFER: usize = 16 << 20;

/// pcapng's obsolete Packet Block (spec appendix A): still written by old tools.
const PACKET_BLOCK: u32 = 2;

/// A pcapng interface, as its Interface Description Block says.
#[derive(Debug, Clone, Copy)]
struct Interface {
    link: Linktype,
    /// The most bytes of a packet it captured (0: no limit).
    snaplen: u32,
    /// Timestamp units per second (`if_tsresol`).
    units_per_s: u64,
    /// Seconds added to every timestamp (`if_tsoffset`).
    offset_s: i64,
}

impl Interface {
    /// Reads the options in the section's byte order: pcap-parser 0.17 reads `if_tsoffset`
    /// little-endian in every section, and takes a binary `if_tsresol` (top bit set, 2^-n s)
    /// for invalid.
    fn new(idb: &InterfaceDescriptionBlock<'_>, big_endian: bool) -> Self {
        let mut iface = Interface {
            link: idb.linktype,
            snaplen: idb.snaplen,
            units_per_s: 1_000_000,
            offset_s: 0,
        };
        for o in &idb.options {
            let Ok(v) = o.as_bytes() else { continue };
            if o.code == OptionCode::IfTsresol && !v.is_empty() {
                // pcapng 4.2: 10^-n s, or with the top bit set 2^-n s. An exponent past
                // what a u64 holds keeps microseconds.
                let n = u32::from(v[0] & 0x7f);
                let units = if v[0] & 0x80 == 0 {
                    10u64.checked_pow(n)
                } else {
                    1u64.checked_shl(n)
                };
                iface.units_per_s = units.unwrap_or(1_000_000);
            } else if o.code == OptionCode::IfTsoffset
                && let Ok(b) = <[u8; 8]>::try_from(v)
            {
                iface.offset_s = if big_endian {
                    i64::from_be_bytes(b)
                } else {
                    i64::from_le_bytes(b)
                };
            }
        }
        iface
    }

    /// A packet's timestamp (the 64-bit count of units) as a [`Time`], saturating.
    fn time(&self, high: u32, low: u32) -> Time {
        let units = (u64::from(high) << 32) | u64::from(low);
        let us = u128::from(units) * 1_000_000 / u128::from(self.units_per_s);
        let us = u64::try_from(us).unwrap_or(u64::MAX);
        Time(us.saturating_add_signed(self.offset_s.saturating_mul(1_000_000)))
    }
}

/// A step back in the capture's clock at least this long is the clock being set (an NTP step,
/// captures joined with `mergecap -a`): replay shifts everything after it forward, so later
/// pauses keep their length. A shorter one is taken as reordering (the interfaces of a pcapng
/// stamp their packets apart) and held at the newest time: an offset for each would add up
/// and run the clock fast.
const CLOCK_STEP: u64 = 1_000_000;

/// The replay's clock: the capture's timestamps, never going back, and with the time a clock
/// step went back added to everything after it. Replay drives the core with it, and measures
/// the frames it does not feed with copies of it, one per capture interface; the reassembly
/// of IP fragments times out by one of its own per capture interface.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ReplayClock {
    last: Time,
    offset: u64,
}

impl ReplayClock {
    /// The replay time of a packet captured at `captured`.
    pub(crate) fn at(&mut self, captured: Time) -> Time {
        self.tick(captured).0
    }

    /// The newest replay time given.
    pub(crate) fn now(&self) -> Time {
        self.last
    }

    /// As [`ReplayClock::at`], and whether the capture's clock was set back at this packet.
    fn tick(&mut self, captured: Time) -> (Time, bool) {
        let t = captured.0.saturating_add(self.offset);
        let stepped = t.saturating_add(CLOCK_STEP) <= self.last.0;
        if stepped {
            self.offset = self.offset.saturating_add(self.last.0 - t);
        }
        self.last = self.last.max(Time(t));
        (self.last, stepped)
    }
}

/// An unknown block's type: pcap-parser reads it little-endian in every section.
fn block_type(read_le: u32, big_endian: bool) -> u32 {
    if big_endian {
        read_le.swap_bytes()
    } else {
        read_le
    }
}

/// An obsolete Packet Block's body: interface id, timestamp and the captured bytes (caplen of
/// them), or `None` when the block is too short for what it claims.
fn packet_block(body: &[u8], big_endian: bool) -> Option<(usize, u32, u32, &[u8], u32)> {
    let u16_at = |i: usize| -> Option<u16> {
        let b = body.get(i..i + 2)?.try_into().ok()?;
        Some(if big_endian {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    };
    let u32_at = |i: usize| -> Option<u32> {
        let b = body.get(i..i + 4)?.try_into().ok()?;
        Some(if big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    };
    // interface id (16 bits), drops count (16), timestamp high, low, captured, original length.
    let if_id = usize::from(u16_at(0)?);
    let (high, low, caplen, origlen) = (u32_at(4)?, u32_at(8)?, u32_at(12)?, u32_at(16)?);
    let data = body.get(20..)?.get(..usize::try_from(caplen).ok()?)?;
    Some((if_id, high, low, data, origlen))
}

/// As [`read_udp`], from any reader (fuzzing feeds bytes here).
pub fn read_udp_from(
    reader: impl io::Read + Send,
    each: &mut dyn FnMut(Datagram),
) -> Result<CaptureStats, CaptureError> {
    read_frames_from(reader, &mut |f| {
        if let Frame::Udp(d, _) = f {
            each(d);
        }
        ControlFlow::Continue(())
    })
}

/// The file's header, read whole: pcap-parser tells pcap from pcapng, and reads the header,
/// from its first read alone, which a pipe may cut short (it gives what was written so far).
/// The 24-byte pcap header, or the pcapng Section Header Block (as long as its length says,
/// up to the reader's largest buffer: a long capture comment makes it larger than the first);
/// less only at the end of the file, and then whether a pcapng's was cut short.
fn read_head(reader: &mut impl io::Read) -> io::Result<(Vec<u8>, bool)> {
    const PCAP_HEADER: usize = 24;
    let mut head = Vec::new();
    let mut need = PCAP_HEADER;
    while head.len() < need {
        let mut buf = [0; 512];
        let want = (need - head.len()).min(buf.len());
        match reader.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if need == PCAP_HEADER && head.len() >= 12 && head[..4] == [0x0a, 0x0d, 0x0d, 0x0a] {
            let mut le = true;
            if let Some(len) = pcapng_block_len(&head, &mut le) {
                need = usize::try_from(len).map_or(MAX_BUFFER, |l| l.clamp(12, MAX_BUFFER));
            }
        }
    }
    let short = head.len() < need && head.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]);
    Ok((head, short))
}

/// Why a file whose first bytes `head` are no pcap or pcapng magic number is not read: a
/// capture compressed as Wireshark and tcpdump's rotation write them (which Wireshark reads as
/// they are) says how, and to decompress it; pcap-parser's word, `HeaderNotRecognized`, would
/// say neither.
fn not_a_capture(head: &[u8]) -> String {
    let compressed = [
        (&[0x1f, 0x8b][..], "gzip", "gunzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd", "unzstd"),
        (&[0x04, 0x22, 0x4d, 0x18][..], "lz4", "unlz4"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0][..], "xz", "unxz"),
        (&b"BZh"[..], "bzip2", "bunzip2"),
    ];
    match compressed
        .iter()
        .find(|(magic, ..)| head.starts_with(magic))
    {
        Some((_, how, tool)) => {
            format!("the file is compressed with {how}: decompress it first ({tool})")
        }
        None => "its first bytes are no pcap or pcapng header".into(),
    }
}

/// A reader that keeps the I/O error it last failed with: pcap-parser turns every one into a
/// bare `PcapError::ReadError`, which would lose the cause (a disk error, a directory given as
/// the file) and blame the file's format.
struct KeepsError<'a, R> {
    inner: R,
    error: &'a Mutex<Option<io::Error>>,
}

impl<R: io::Read> io::Read for KeepsError<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            let kind = e.kind();
            *self.error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            kind.into()
        })
    }
}

/// What a failed read of the capture is: the I/O error [`KeepsError`] kept, or a bad format.
fn read_failed<I: std::fmt::Debug>(
    e: PcapError<I>,
    kept: &Mutex<Option<io::Error>>,
) -> CaptureError {
    let kept = kept.lock().unwrap_or_else(PoisonError::into_inner).take();
    match (e, kept) {
        (PcapError::ReadError, Some(io)) => CaptureError::Io(io),
        (e, _) => CaptureError::Format(format!("{e:?}")),
    }
}

/// A format error after packet records were read is a corrupt record in a readable capture,
/// not a file that is no capture at all: said so, with how many came before it.
fn corrupt_after(e: CaptureError, stats: &CaptureStats) -> CaptureError {
    match e {
        CaptureError::Format(detail) if stats.frames > 0 => CaptureError::Corrupt {
            after: stats.frames,
            detail,
        },
        e => e,
    }
}

/// As [`read_frames`], from any reader.
pub fn read_frames_from(
    reader: impl io::Read + Send,
    each: &mut dyn FnMut(Frame) -> ControlFlow<()>,
) -> Result<CaptureStats, CaptureError> {
    let mut reader = reader;
    let (head, short) = read_head(&mut reader).map_err(CaptureError::Io)?;
    // The reader's first read must hold the header whole.
    let mut capacity = INITIAL_BUFFER.max(head.len());
    let not_a_capture = not_a_capture(&head);
    let error = Mutex::new(None);
    let reader = KeepsError {
        inner: io::Read::chain(io::Cursor::new(head), reader),
        error: &error,
    };
    let mut reader = create_reader(capacity, reader).map_err(|e| match e {
        // pcap-parser's own words ("Eof", "Incomplete(2)") would not tell the user why.
        PcapError::Eof => CaptureError::Format("the file is empty".into()),
        PcapError::Incomplete(_) => CaptureError::Format("the file ends inside its header".into()),
        // A pcapng cut inside its Section Header Block: pcap-parser, failing to read the
        // block, tries pcap's magic.
        PcapError::HeaderNotRecognized if short => {
            CaptureError::Format("the file ends inside its header".into())
        }
        PcapError::HeaderNotRecognized => CaptureError::Format(not_a_capture),
        e => read_failed(e, &error),
    })?;
    let mut stats = CaptureStats::default();
    let mut reassembler = Reassembler::default();
    let mut legacy_link = Linktype::ETHERNET;
    let mut legacy_nanos = false;
    // A pcap's byte order, once its header was read.
    let mut legacy_be: Option<bool> = None;
    // The current pcapng section's interfaces and byte order.
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut big_endian = false;
    let mut le = true;
    // The current section's last packet times: interface 0's, and any interface's (the time a
    // Simple Packet Block, which has none, is taken at).
    let mut last_if0: Option<Time> = None;
    let mut last_any: Option<Time> = None;
    let pcapng = reader.data().starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]);
    loop {
        // pcap-parser 0.17 subtracts 12 from a pcapng block's length without checking it
        // (a panic in debug builds): refuse such a block here first.
        let block_len = if pcapng {
            pcapng_block_len(reader.data(), &mut le)
        } else {
            None
        };
        if let Some(caplen) = legacy_be.and_then(|be| pcap_caplen(reader.data(), be))
            && caplen > MAX_PCAP_CAPLEN
        {
            return Err(corrupt_after(
                CaptureError::Format(format!(
                    "pcap record with a captured length of {caplen} bytes, more than \
                     {MAX_PCAP_CAPLEN}"
                )),
                &stats,
            ));
        }
        if block_len.is_some_and(|len| len < 12) {
            return Err(corrupt_after(
                CaptureError::Format("pcapng block shorter than its own header".into()),
                &stats,
            ));
        }
        // The next pcapng block is all in the buffer: if pcap-parser still wants more bytes,
        // its contents (a packet's captured length, an option's or a record's length) run
        // past its Block Total Length. That is a corrupt block, not a file cut short: reading
        // on for the bytes would take the blocks after it as its contents and drop them.
        let whole = block_len.is_some_and(|len| reader.data().len() >= len as usize);
        // Such a block that replay does not use (a Name Resolution Block whose records fill it
        // without the end record, which Wireshark reads; any block but the section's, the
        // interfaces' and the packets'), its two Block Total Lengths agreeing, is skipped:
        // its contents matter to nothing replayed, and the blocks after it are whole.
        let skippable = block_len.filter(|_| whole).and_then(|len| {
            let data = reader.data();
            let len = usize::try_from(len).ok()?;
            let used = [0x0a0d_0d0a, 1, PACKET_BLOCK, 3, 6].contains(&u32_at(data, 0, le)?);
            (!used && u32_at(data, len - 4, le)? as usize == len).then_some(len)
        });
        let overrun = || {
            corrupt_after(
                CaptureError::Format("pcapng block whose contents run past its length".into()),
                &stats,
            )
        };
        match reader.next() {
            Ok((offset, block)) => {
                // A packet on an interface the section did not describe is counted, skipped.
                let on = |if_id: usize, high: u32, low: u32, data, origlen| {
                    let iface = interfaces.get(if_id)?;
                    Some((iface.time(high, low), iface.link, if_id, data, origlen))
                };
                let frame =
                    match block {
                        PcapBlockOwned::LegacyHeader(h) => {
                            // The low 16 bits: the high ones may say the frames end in an FCS
                            // (the pcap spec's FCS length and its P bit; libpcap's LT_LINKTYPE),
                            // which the IP lengths leave out.
                            legacy_link = Linktype(h.network.0 & 0xffff);
                            legacy_nanos = h.is_nanosecond_precision();
                            legacy_be = Some(h.is_bigendian());
                            None
                        }
                        PcapBlockOwned::Legacy(b) => {
                            let frac = if legacy_nanos {
                                u64::from(b.ts_usec) / 1000
                            } else {
                                u64::from(b.ts_usec)
                            };
                            let t = Time(u64::from(b.ts_sec) * 1_000_000 + frac);
                            Some(Some((
                                t,
                                legacy_link,
                                0,
                                captured(b.data, b.caplen),
                                b.origlen,
                            )))
                        }
                        PcapBlockOwned::NG(Block::SectionHeader(shb)) => {
                            // A new section (pcapng 4.1): its interfaces are others, numbered
                            // from 0 again, so what was pending is left unfinished.
                            interfaces.clear();
                            (last_if0, last_any) = (None, None);
                            reassembler.finish(&mut stats);
                            big_endian = shb.big_endian();
                            None
                        }
                        PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                            interfaces.push(Interface::new(&idb, big_endian));
                            None
                        }
                        PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                            // `epb.data` holds the padding to 32 bits: cut to what was captured,
                            // or a datagram cut by the snap length by 1-3 bytes ends in zeros
                            // and reads as whole.
                            let data = captured(epb.data, epb.caplen);
                            Some(on(
                                epb.if_id as usize,
                                epb.ts_high,
                                epb.ts_low,
                                data,
                                epb.origlen,
                            ))
                        }
                        PcapBlockOwned::NG(Block::Unknown(b))
                            if block_type(b.block_type, big_endian) == PACKET_BLOCK =>
                        {
                            let packet = packet_block(b.data, big_endian);
                            Some(packet.and_then(|(id, high, low, data, len)| {
                                on(id, high, low, data, len)
                            }))
                        }
                        PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
                            // pcapng 4.4: a packet of the first interface, without a timestamp,
                            // its captured length the lesser of its original length and the
                            // interface's snap length (`data` holds the padding to 32 bits).
                            let time = last_if0.or(last_any).unwrap_or(Time(0));
                            Some(interfaces.first().map(|iface| {
                                let caplen = match iface.snaplen {
                                    0 => spb.origlen,
                                    snap => spb.origlen.min(snap),
                                };
                                (time, iface.link, 0, captured(spb.data, caplen), spb.origlen)
                            }))
                        }
                        PcapBlockOwned::NG(_) => None,
                    };
                // None: not a packet; Some(None): a packet we cannot use.
                if let Some(Some((t, _, if_id, ..))) = frame {
                    last_any = Some(t);
                    if if_id == 0 {
                        last_if0 = Some(t);
                    }
                }
                let flow = match frame {
                    Some(frame) => take_frame(frame, &mut reassembler, &mut stats, each),
                    None => ControlFlow::Continue(()),
                };
                reader.consume(offset);
                if flow.is_break() {
                    break;
                }
            }
            Err(PcapError::Eof) => break,
            Err(
                PcapError::UnexpectedEof | PcapError::Incomplete(_) | PcapError::BufferTooSmall,
            ) if whole => match skippable {
                Some(len) => reader.consume(len),
                None => return Err(overrun()),
            },
            Err(PcapError::UnexpectedEof) => {
                stats.cut_short = true;
                break;
            }
            Err(PcapError::Incomplete(_)) => match reader.refill() {
                Ok(()) => {}
                Err(PcapError::UnexpectedEof | PcapError::Eof) => {
                    stats.cut_short = true;
                    break;
                }
                Err(e) => return Err(corrupt_after(read_failed(e, &error), &stats)),
            },
            Err(PcapError::BufferTooSmall) => {
                // The next record does not fit: grow, then read on.
                if capacity >= MAX_BUFFER {
                    return Err(corrupt_after(
                        CaptureError::Format(format!(
                            "a record of more than {} MiB (a corrupt length?)",
                            MAX_BUFFER >> 20
                        )),
                        &stats,
                    ));
                }
                capacity = (capacity * 2).min(MAX_BUFFER);
                reader.grow(capacity);
                reader
                    .refill()
                    .map_err(|e| corrupt_after(read_failed(e, &error), &stats))?;
            }
            Err(e) => return Err(corrupt_after(read_failed(e, &error), &stats)),
        }
    }
    reassembler.finish(&mut stats);
    Ok(stats)
}

/// Counts one packet record (`None`: one we cannot use) and hands out its datagram, whole or
/// the one it completes, or else its time; what `each` says.
fn take_frame(
    frame: Option<(Time, Linktype, usize, &[u8], u32)>,
    reassembler: &mut Reassembler,
    stats: &mut CaptureStats,
    each: &mut dyn FnMut(Frame) -> ControlFlow<()>,
) -> ControlFlow<()> {
    stats.frames += 1;
    let Some((time, link, interface, data, origlen)) = frame else {
        stats.skipped += 1;
        stats.no_interface += 1;
        return ControlFlow::Continue(());
    };
    reassembler.tick(interface, time, stats);
    match packet_of(data, link, interface) {
        Some(Packet::Whole(source, destination, payload)) => {
            stats.udp += 1;
            each(Frame::Udp(
                Datagram {
                    time,
                    source,
                    destination,
                    payload: payload.to_vec(),
                },
                interface,
            ))
        }
        Some(Packet::Fragment(fragment)) => {
            stats.fragments += 1;
            match reassembler.add(time, fragment, stats) {
                Some(datagram) => {
                    stats.udp += 1;
                    each(Frame::Udp(datagram, interface))
                }
                None => each(Frame::Other(time, interface)),
            }
        }
        None => {
            stats.skipped += 1;
            if !supported(link) {
                stats.unsupported_link += 1;
                // The link type field is 16 bits in pcapng, and cut to them in a pcap.
                stats.unsupported_link_type.get_or_insert(link.0 as u16);
            } else if holds_udp(data, link) {
                if data.len() < usize::try_from(origlen).unwrap_or(usize::MAX) {
                    stats.cut_by_snaplen += 1;
                } else {
                    stats.udp_malformed += 1;
                }
            }
            each(Frame::Other(time, interface))
        }
    }
}

/// Whether a frame [`packet_of`] could not read (the snap length cut it short, or its lengths
/// are wrong) carries a UDP datagram or a fragment of one, as far as its IP header, read
/// laxly, tells.
fn holds_udp(data: &[u8], link: Linktype) -> bool {
    let sliced = match inner(data, link) {
        Some(Inner::Ethernet(frame)) => LaxSlicedPacket::from_ethernet(frame).ok(),
        Some(Inner::EtherType(t, packet)) => Some(LaxSlicedPacket::from_ether_type(t, packet)),
        Some(Inner::Ip(packet)) => LaxSlicedPacket::from_ip(packet).ok(),
        None => None,
    };
    match sliced.and_then(|s| s.net) {
        Some(LaxNetSlice::Ipv4(ip)) => ip.payload().ip_number == IpNumber::UDP,
        Some(LaxNetSlice::Ipv6(ip)) => ip.payload().ip_number == IpNumber::UDP,
        _ => false,
    }
}

/// The bytes a record captured: its data cut to its captured length (pcapng pads to 32 bits).
fn captured(data: &[u8], caplen: u32) -> &[u8] {
    let caplen = usize::try_from(caplen).unwrap_or(usize::MAX);
    &data[..caplen.min(data.len())]
}

/// The most a pcap record captures: libpcap's largest snap length (`MAXIMUM_SNAPLEN`), past
/// which libpcap, tcpdump and Wireshark call the file bad. A longer one is a corrupt length:
/// read as one, it would take the records after it for its bytes.
const MAX_PCAP_CAPLEN: u32 = 262_144;

/// The captured length the next pcap record claims, once the buffer holds it (after the
/// timestamp's two 32-bit words, in every pcap variant).
fn pcap_caplen(data: &[u8], big_endian: bool) -> Option<u32> {
    u32_at(data, 8, !big_endian)
}

/// The 32-bit field at `i` of a capture's bytes, in its byte order (`le`: little-endian).
fn u32_at(data: &[u8], i: usize, le: bool) -> Option<u32> {
    let b: [u8; 4] = data.get(i..i + 4)?.try_into().ok()?;
    Some(if le {
        u32::from_le_bytes(b)
    } else {
        u32::from_be_bytes(b)
    })
}

/// The Block Total Length the next pcapng block claims, once the buffer holds it. Tracks the
/// section's byte order from each Section Header Block.
fn pcapng_block_len(data: &[u8], le: &mut bool) -> Option<u32> {
    const SHB: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
    if data.len() < 8 {
        return None;
    }
    if data[..4] == SHB && data.len() >= 12 {
        *le = data[8..12] == [0x4d, 0x3c, 0x2b, 0x1a];
    }
    u32_at(data, 4, *le)
}

/// What a frame carries that replay uses.
enum Packet<'a> {
    /// A whole UDP datagram: source, destination, payload.
    Whole(SocketAddr, SocketAddr, &'a [u8]),
    /// One fragment of a UDP datagram.
    Fragment(Fragment<'a>),
}

/// What a frame's link layer carries ([`inner`]).
enum Inner<'a> {
    Ethernet(&'a [u8]),
    /// A packet of this EtherType (a VLAN tag's, or a GRE device's protocol).
    EtherType(etherparse::EtherType, &'a [u8]),
    Ip(&'a [u8]),
}

/// Whether replay reads frames of `link`: only the link types a T.140 capture comes in;
/// pcap-parser 0.17's decoders for others (Wireshark upper PDU, NFLOG) panic on malformed
/// frames (found by the pcap_read fuzzer).
fn supported(link: Linktype) -> bool {
    [
        Linktype::ETHERNET,
        Linktype::RAW,
        Linktype::LINUX_SLL,
        Linktype::LINUX_SLL2,
        Linktype::IPV4,
        Linktype::IPV6,
        Linktype::NULL,
        Linktype::LOOP,
    ]
    .contains(&link)
}

/// What follows a frame's link layer, for [`packet_of`] and [`holds_udp`] to slice, for the
/// link types replay reads ([`supported`]).
fn inner(data: &[u8], link: Linktype) -> Option<Inner<'_>> {
    if !supported(link) {
        return None;
    }
    Some(match get_packetdata(data, link, data.len())? {
        // OpenBSD's loopback: BSD loopback's 4-byte address family (in network byte order)
        // before the IP packet; pcap-parser 0.17 has no decoder for it. The IP version says
        // which IP, as with LINKTYPE_NULL.
        PacketData::Unsupported(_) if link == Linktype::LOOP => Inner::Ip(data.get(4..)?),
        PacketData::L2(frame) => Inner::Ethernet(frame),
        // A Linux cooked capture (SLL, SLL2) of a VLAN-tagged frame: libpcap puts the 802.1Q
        // tag back after the cooked header, whose protocol then says VLAN.
        PacketData::L3(ethertype @ (0x8100 | 0x88a8 | 0x9100), packet) => {
            Inner::EtherType(etherparse::EtherType(ethertype), packet)
        }
        PacketData::L3(_, packet) => Inner::Ip(packet),
        // A Linux cooked capture of a GRE tunnel device (ARPHRD_IPGRE): the protocol field is
        // the GRE protocol type and the inner packet follows (the SLL and SLL2 specs), which
        // pcap-parser 0.17 takes for a GRE header.
        PacketData::L4(47, packet)
            if link == Linktype::LINUX_SLL || link == Linktype::LINUX_SLL2 =>
        {
            let at = if link == Linktype::LINUX_SLL { 14 } else { 0 };
            let proto = u16::from_be_bytes(data.get(at..at + 2)?.try_into().ok()?);
            Inner::EtherType(etherparse::EtherType(proto), packet)
        }
        PacketData::L4(..) | PacketData::Unsupported(_) => return None,
    })
}

fn packet_of(data: &[u8], link: Linktype, interface: usize) -> Option<Packet<'_>> {
    let sliced = match inner(data, link)? {
        Inner::Ethernet(frame) => SlicedPacket::from_ethernet(frame).ok()?,
        Inner::EtherType(t, packet) => SlicedPacket::from_ether_type(t, packet).ok()?,
        Inner::Ip(packet) => SlicedPacket::from_ip(packet).ok()?,
    };
    // Where the link layer says this copy was captured, for the fragments' key.
    let link_key = || {
        let mut key = LinkKey::default();
        let u32_at = |i: usize| data.get(i..i + 4).and_then(|b| b.try_into().ok());
        if link == Linktype::LINUX_SLL {
            // Packet type (16 bits), then the link-layer address type, length, address.
            key.packet_type = data
                .get(..2)
                .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        } else if link == Linktype::LINUX_SLL2 {
            // Protocol, reserved, interface index, link-layer address type, packet type.
            key.ifindex = u32_at(4).map_or(0, u32::from_be_bytes);
            key.packet_type = data.get(10).map_or(0, |&t| u16::from(t));
        }
        // A tag with VLAN id 0 (802.1p priority only) puts the frame on no VLAN: the same
        // link as an untagged frame.
        let vlans = sliced.link_exts.iter().filter_map(|e| match e {
            LinkExtSlice::Vlan(v) => Some(v.vlan_identifier().value()).filter(|&id| id != 0),
            LinkExtSlice::Macsec(_) => None,
        });
        for (slot, id) in key.vlans.iter_mut().zip(vlans) {
            *slot = id;
        }
        key
    };
    let (src, dst): (IpAddr, IpAddr) = match sliced.net.as_ref()? {
        NetSlice::Ipv4(ip) => {
            let h = ip.header();
            let (src, dst) = (h.source_addr().into(), h.destination_addr().into());
            if ip.is_payload_fragmented() {
                if ip.payload().ip_number != IpNumber::UDP {
                    return None;
                }
                // Linux (`ip_frag_queue`) cuts a non-last IPv4 fragment's end down to a
                // multiple of 8 bytes (RFC 791 places fragments in 8-byte units) rather than
                // drop it; one left empty drops its reassembly. IPv6 must discard it.
                let payload = ip.payload().payload;
                let more = h.more_fragments();
                let data = if more {
                    &payload[..payload.len() & !7]
                } else {
                    payload
                };
                return Some(Packet::Fragment(Fragment {
                    key: FragmentKey {
                        interface,
                        link: link_key(),
                        source: src,
                        destination: dst,
                        id: u32::from(h.identification()),
                    },
                    offset: h.fragments_offset(),
                    more,
                    data,
                    // RFC 791 section 3.1: the Total Length, header included, is 16 bits.
                    header: usize::from(h.ihl()) * 4,
                    timeout: IPV4_REASSEMBLY_TIME,
                }));
            }
            (src, dst)
        }
        NetSlice::Ipv6(ip) => {
            let h = ip.header();
            let (src, dst) = (h.source_addr().into(), h.destination_addr().into());
            if ip.is_payload_fragmented() {
                let exts = ip.extensions();
                let frag = exts.clone().into_iter().find_map(|e| match e {
                    Ipv6ExtensionSlice::Fragment(f) => Some(f),
                    _ => None,
                })?;
                // Only UDP right after the fragment header: the fragmentable part (RFC 8200
                // section 4.5) is then exactly the payload etherparse gives.
                if frag.next_header() != IpNumber::UDP || ip.payload().ip_number != IpNumber::UDP {
                    return None;
                }
                // The reassembled Payload Length (16 bits) counts the extension headers
                // before the fragment header too (RFC 8200 section 4.5).
                let header = exts.slice().len().saturating_sub(frag.slice().len());
                return Some(Packet::Fragment(Fragment {
                    key: FragmentKey {
                        interface,
                        link: link_key(),
                        source: src,
                        destination: dst,
                        id: frag.identification(),
                    },
                    offset: frag.fragment_offset(),
                    more: frag.more_fragments(),
                    data: ip.payload().payload,
                    header,
                    timeout: IPV6_REASSEMBLY_TIME,
                }));
            }
            (src, dst)
        }
        NetSlice::Arp(_) => return None,
    };
    match sliced.transport? {
        // Linux drops an IPv4 datagram whose UDP Length is under 8 (`__udp4_lib_rcv`), 0 too;
        // etherparse reads 0 as the rest of the packet, which only an IPv6 jumbogram may mean
        // (RFC 2675 section 4; Linux's IPv6 takes it so).
        TransportSlice::Udp(udp) if src.is_ipv4() && udp.length() < UdpHeader::LEN_U16 => None,
        TransportSlice::Udp(udp) => Some(Packet::Whole(
            SocketAddr::new(src, udp.source_port()),
            SocketAddr::new(dst, udp.destination_port()),
            udp.payload(),
        )),
        _ => None,
    }
}

/// The largest IPv4 Total Length and IPv6 Payload Length (both 16 bits; no jumbograms).
const MAX_IP_LEN: usize = 65_535;

/// How long an IPv4 reassembly waits for its missing fragments after its first one: Linux's
/// `ipfrag_time`. RFC 791 section 3.2 leaves the timer to the implementation.
const IPV4_REASSEMBLY_TIME: Duration = Duration::from_secs(30);

/// The same for IPv6: RFC 8200 section 4.5 says 60 s after the first-arriving fragment.
const IPV6_REASSEMBLY_TIME: Duration = Duration::from_secs(60);

/// The most reassemblies pending at once; a new one past it drops the oldest.
pub const MAX_PENDING_REASSEMBLIES: usize = 256;

/// The most bytes the pending reassemblies may hold together (Linux's `ipfrag_high_thresh`);
/// past it the oldest are dropped. A reassembly takes room up to its highest fragment's end
/// (at most 64 KiB), however little it has received.
pub const MAX_PENDING_REASSEMBLY_BYTES: usize = 4 << 20;

/// Which datagram a fragment belongs to (RFC 791 section 3.2: source, destination, protocol,
/// identification; RFC 8200 section 4.5: source, destination, identification). Only UDP
/// fragments are kept, so the protocol is always UDP. The capture interface (pcapng's, or
/// the one a Linux cooked capture names) keeps apart the copies of one datagram captured on
/// two, as the direction and the VLAN do those captured twice on one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FragmentKey {
    /// The pcapng interface (0 in a pcap).
    interface: usize,
    link: LinkKey,
    source: IpAddr,
    destination: IpAddr,
    id: u32,
}

/// What the link layer tells of where a copy was captured: 0 where it tells nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LinkKey {
    /// The interface index of LINKTYPE_LINUX_SLL2 (`tcpdump -i any`): a forwarded datagram is
    /// captured coming in on one interface and going out on another.
    ifindex: u32,
    /// The packet type of LINKTYPE_LINUX_SLL and SLL2 (to this host, outgoing...): with
    /// `-i any`, a datagram sent over `lo` is captured going out and coming in.
    packet_type: u16,
    /// The VLAN id of each 802.1Q tag (IEEE 802.1Q: 1 to 4094), outermost first, priority
    /// tags left out: a datagram routed between two VLANs of one trunk is captured on both.
    vlans: [u16; SlicedPacket::LINK_EXTS_CAP],
}

/// One fragment of a UDP datagram, as one frame carries it.
struct Fragment<'a> {
    key: FragmentKey,
    offset: IpFragOffset,
    more: bool,
    data: &'a [u8],
    /// What its header counts in the 16-bit length field besides the fragments' data: the
    /// IPv4 header with its options, or the IPv6 extension headers before the Fragment
    /// header. The reassembled datagram takes its first fragment's (RFC 791 section 3.2, RFC
    /// 8200 section 4.5), which may hold more than the others' (options not copied).
    header: usize,
    timeout: Duration,
}

/// A datagram being reassembled. etherparse's `IpDefragBuf` keeps its bytes and the ranges
/// received; its `IpDefragPool` is not used, for it has no bound on reassemblies or bytes,
/// times a reassembly from its latest fragment, and lets an overlapping fragment overwrite.
#[derive(Debug)]
struct Pending {
    key: FragmentKey,
    /// Its first fragment's time (by its interface's [`ReplayClock`]) plus the reassembly time.
    deadline: Time,
    /// The header (`Fragment::header`) of the fragment at offset 0, once it came.
    header: Option<usize>,
    buf: IpDefragBuf,
}

impl Pending {
    /// The bytes it holds on the heap.
    fn cost(&self) -> usize {
        self.buf.data().capacity()
            + self.buf.sections().capacity() * std::mem::size_of::<IpFragRange>()
    }
}

/// What a fragment is to the reassembly it belongs to.
enum Fit {
    New,
    Duplicate,
    Invalid,
}

/// Reassembles fragmented UDP datagrams (RFC 791 section 3.2, RFC 8200 section 4.5) in
/// capture time, within fixed bounds on reassemblies and bytes.
#[derive(Debug, Default)]
struct Reassembler {
    /// Oldest first.
    pending: Vec<Pending>,
    /// What `pending` holds on the heap.
    bytes: usize,
    /// The time reassemblies wait by, one per capture interface (the fragment key's): each
    /// the capture's as replay takes it, moved by that interface's frames alone. The
    /// interfaces of a pcapng may stamp a minute apart (a NIC stamping in hardware): one
    /// clock for all would take that for time passing, or for a step, and give up a
    /// reassembly its own interface's fragments complete 1 ms later.
    clocks: Vec<InterfaceClock>,
}

/// A capture interface's clock, for the reassemblies of its fragments.
#[derive(Debug, Default)]
struct InterfaceClock {
    clock: ReplayClock,
    /// No deadline of the interface's reassemblies is earlier (some may be later: the one
    /// that set it may be gone).
    next_deadline: Option<Time>,
}

impl Reassembler {
    /// Moves `interface`'s clock on to a frame of it captured at `captured`, giving up the
    /// interface's reassemblies whose time has run out. Where its clock was set back, all of
    /// them are given up: the time they waited across the step cannot be told (replay counts
    /// none, but Linux times reassemblies on a monotonic clock), and one kept could take
    /// fragments of a later datagram with the same identification, mixing two datagrams or
    /// dropping the later one.
    fn tick(&mut self, interface: usize, captured: Time, stats: &mut CaptureStats) {
        if self.clocks.len() <= interface {
            self.clocks
                .resize_with(interface + 1, InterfaceClock::default);
        }
        let c = &mut self.clocks[interface];
        let (now, stepped) = c.clock.tick(captured);
        if stepped {
            c.next_deadline = None;
            stats.reassembly_timeouts += self.drop_where(|p| p.key.interface == interface);
        } else if c.next_deadline.is_some_and(|d| d <= now) {
            stats.reassembly_timeouts +=
                self.drop_where(|p| p.key.interface == interface && p.deadline <= now);
            self.clocks[interface].next_deadline = self
                .pending
                .iter()
                .filter(|p| p.key.interface == interface)
                .map(|p| p.deadline)
                .min();
        }
    }

    /// Ends every pending reassembly as unfinished: the capture or its section ended. The
    /// interfaces' clocks go with them: a new section's interfaces are others.
    fn finish(&mut self, stats: &mut CaptureStats) {
        stats.reassembly_unfinished += self.drop_where(|_| true);
        self.clocks.clear();
    }

    /// Drops the pending reassemblies `dropped` picks; how many.
    fn drop_where(&mut self, dropped: impl Fn(&Pending) -> bool) -> u64 {
        let before = self.pending.len();
        let mut bytes = self.bytes;
        self.pending.retain(|p| {
            let drop = dropped(p);
            if drop {
                bytes -= p.cost();
            }
            !drop
        });
        self.bytes = bytes;
        (before - self.pending.len()) as u64
    }

    fn remove(&mut self, i: usize) -> Pending {
        let p = self.pending.remove(i);
        self.bytes -= p.cost();
        p
    }

    /// Adds a fragment received at `time`; gives the datagram it completes.
    fn add(&mut self, time: Time, f: Fragment<'_>, stats: &mut CaptureStats) -> Option<Datagram> {
        let found = self.pending.iter().position(|p| p.key == f.key);
        let start = usize::from(f.offset.byte_offset());
        let end = start + f.data.len();
        // RFC 791 section 3.2 and RFC 8200 section 4.5: every fragment but the last carries a
        // multiple of 8 bytes (an IPv4 one is already cut to that), and the whole, with the
        // first fragment's header, fits the length field (Linux checks the reassembled length
        // with it). Until the first fragment comes, each one's own header is the least it can
        // be; the bytes reach as far as the highest end received (etherparse's buffer length).
        // An empty fragment is malformed too (Linux drops its reassembly).
        let (header, far) = found.map_or((f.header, 0), |i| {
            let p = &self.pending[i];
            (p.header.unwrap_or(f.header), p.buf.data().len())
        });
        if f.data.is_empty()
            || (f.more && !f.data.len().is_multiple_of(8))
            || end.max(far) + header > MAX_IP_LEN
        {
            if let Some(i) = found {
                self.remove(i);
            }
            stats.reassembly_invalid += 1;
            return None;
        }
        let i = match found {
            Some(i) => i,
            None => {
                if self.pending.len() >= MAX_PENDING_REASSEMBLIES {
                    self.remove(0);
                    stats.reassembly_evicted += 1;
                }
                // `tick` made the interface's clock for this frame.
                let c = &mut self.clocks[f.key.interface];
                let deadline = c.clock.now().saturating_add(f.timeout);
                c.next_deadline = Some(c.next_deadline.map_or(deadline, |d| d.min(deadline)));
                self.pending.push(Pending {
                    key: f.key,
                    deadline,
                    header: None,
                    buf: IpDefragBuf::new(IpNumber::UDP, Vec::new(), Vec::new()),
                });
                self.pending.len() - 1
            }
        };
        let p = &mut self.pending[i];
        match fit(&p.buf, start, end, f.more, f.data) {
            Fit::Duplicate => {
                stats.fragments_duplicate += 1;
                return None;
            }
            Fit::Invalid => {
                self.remove(i);
                stats.reassembly_invalid += 1;
                return None;
            }
            Fit::New => {}
        }
        let before = p.cost();
        if p.buf.add(f.offset, f.more, f.data).is_err() {
            // etherparse refused it (an end it contradicts), by what it held before.
            self.pending.remove(i);
            self.bytes -= before;
            stats.reassembly_invalid += 1;
            return None;
        }
        self.bytes = self.bytes - before + p.cost();
        if start == 0 {
            p.header.get_or_insert(f.header);
        }
        if p.buf.is_complete() {
            let (data, _) = self.remove(i).buf.take_bufs();
            // The UDP header is the first fragment's first 8 bytes.
            let Some((from, to, payload)) = checked_udp(&data, f.key.source, f.key.destination)
            else {
                stats.reassembly_invalid += 1;
                return None;
            };
            stats.reassembled += 1;
            return Some(Datagram {
                time,
                source: SocketAddr::new(f.key.source, from),
                destination: SocketAddr::new(f.key.destination, to),
                payload: payload.to_vec(),
            });
        }
        // Within the bytes bound, dropping the oldest other reassemblies: one alone (64 KiB
        // at most) always fits.
        while self.bytes > MAX_PENDING_REASSEMBLY_BYTES {
            let Some(j) = self.pending.iter().position(|p| p.key != f.key) else {
                break;
            };
            self.remove(j);
            stats.reassembly_evicted += 1;
        }
        None
    }
}

/// A reassembled datagram's UDP header checked as the receiving host's stack would (RFC 768):
/// its Length at least 8 and at most what was reassembled (what follows it is not the
/// datagram's), and a checksum other than 0 right. A fragmented datagram's checksum is made by
/// its sender's software (a network card cannot offload it across fragments), so a capture
/// holds it right; a wrong one is fragments of two datagrams that shared an identification
/// (RFC 4963 section 3), which Linux drops too. Source port, destination port and payload.
fn checked_udp(data: &[u8], source: IpAddr, destination: IpAddr) -> Option<(u16, u16, &[u8])> {
    let length = usize::from(u16::from_be_bytes([*data.get(4)?, *data.get(5)?]));
    if length < UdpHeader::LEN || length > data.len() {
        return None;
    }
    let udp = UdpSlice::from_slice(&data[..length]).ok()?;
    let header = udp.to_header();
    if header.checksum != 0 {
        let sum = match (source, destination) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                header.calc_checksum_ipv4_raw(s.octets(), d.octets(), udp.payload())
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                header.calc_checksum_ipv6_raw(s.octets(), d.octets(), udp.payload())
            }
            _ => return None,
        };
        if sum.ok()? != header.checksum {
            return None;
        }
    }
    Some((udp.source_port(), udp.destination_port(), udp.payload()))
}

/// Whether the fragment covering `start..end` adds to `buf`. RFC 5722 (and RFC 8200 section
/// 4.5): a fragment overlapping another drops the reassembly, but an exact duplicate may be
/// dropped alone; Linux treats IPv4 the same way. Duplicate here: bytes already received,
/// identical, and no different end. A last fragment that ends before bytes already received
/// contradicts them. Only received bytes are compared: etherparse grows its buffer to the
/// highest end seen without filling the gaps.
fn fit(buf: &IpDefragBuf, start: usize, end: usize, more: bool, data: &[u8]) -> Fit {
    let ranges = buf.sections();
    let range = |r: &IpFragRange| (usize::from(r.start), usize::from(r.end));
    if !ranges.iter().map(range).any(|(s, e)| s < end && start < e) {
        if !more && ranges.iter().any(|r| usize::from(r.end) > end) {
            return Fit::Invalid;
        }
        return Fit::New;
    }
    let inside = ranges
        .iter()
        .map(range)
        .any(|(s, e)| s <= start && end <= e);
    let same_end = more || buf.end().map(usize::from) == Some(end);
    // `inside` first: the bytes compared must all have been received (sections merge, so
    // one range holding `start..end` means all of it came).
    if inside && same_end && buf.data().get(start..end) == Some(data) {
        Fit::Duplicate
    } else {
        Fit::Invalid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_step_back_keeps_later_gaps_and_reordering_is_held() {
        let mut c = ReplayClock::default();
        let s = |t: u64| Time(t * 1_000_000);
        let t0 = 1_700_000_000;
        assert_eq!(c.at(s(t0)), s(t0));
        // An hour back: from here on an hour later, so the 10 s between packets stay.
        assert_eq!(c.tick(s(t0 - 3600)), (s(t0), true));
        assert_eq!(c.at(s(t0 - 3590)), s(t0 + 10));
        // Half a second back (two interfaces): held, and no offset is added.
        assert_eq!(c.tick(Time(s(t0 - 3590).0 - 500_000)), (s(t0 + 10), false));
        assert_eq!(c.at(s(t0 - 3589)), s(t0 + 11));
        // A second back is a step again.
        assert_eq!(c.tick(s(t0 - 3590)), (s(t0 + 11), true));
        assert_eq!(c.at(s(t0 - 3589)), s(t0 + 12));
        assert_eq!(c.now(), s(t0 + 12));
    }
}
