//! Reads UDP datagrams out of pcap and pcapng captures (IO shell, used by `replay`).
//!
//! pcap-parser reads both container formats and strips the link layer (Ethernet, Linux cooked
//! SLL/SLL2, raw IP, BSD loopback); etherparse decodes the IPv4/IPv6 and UDP headers.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
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

/// What a capture held besides the datagrams we use.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CaptureStats {
    pub frames: u64,
    pub udp: u64,
    /// Frames that are not UDP over IP (ARP, TCP, ICMP, fragments, unsupported link types),
    /// or whose datagram the snap length cut short.
    pub skipped: u64,
    /// The file ended inside a record (a capture still being written, or its writer killed):
    /// every whole record before it was read, as Wireshark reads such a file.
    pub cut_short: bool,
}

#[derive(Debug)]
pub enum CaptureError {
    Io(io::Error),
    Format(String),
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Io(e) => write!(f, "{e}"),
            CaptureError::Format(e) => write!(f, "not a readable pcap/pcapng capture: {e}"),
        }
    }
}

impl std::error::Error for CaptureError {}

/// Reads every UDP datagram of a capture, in file order, calling `each` for each one.
pub fn read_udp(path: &Path, mut each: impl FnMut(Datagram)) -> Result<CaptureStats, CaptureError> {
    let file = File::open(path).map_err(CaptureError::Io)?;
    read_udp_from(file, &mut each)
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
fn packet_block(body: &[u8], big_endian: bool) -> Option<(usize, u32, u32, &[u8])> {
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
    let (high, low, caplen) = (u32_at(4)?, u32_at(8)?, u32_at(12)?);
    let data = body.get(20..)?.get(..usize::try_from(caplen).ok()?)?;
    Some((if_id, high, low, data))
}

/// As [`read_udp`], from any reader (fuzzing feeds bytes here).
pub fn read_udp_from(
    reader: impl io::Read + Send,
    each: &mut dyn FnMut(Datagram),
) -> Result<CaptureStats, CaptureError> {
    let mut reader = create_reader(INITIAL_BUFFER, reader)
        .map_err(|e| CaptureError::Format(format!("{e:?}")))?;
    let mut capacity = INITIAL_BUFFER;
    let mut stats = CaptureStats::default();
    let mut legacy_link = Linktype::ETHERNET;
    let mut legacy_nanos = false;
    // The current pcapng section's interfaces and byte order.
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut big_endian = false;
    let mut le = true;
    let pcapng = reader.data().starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]);
    loop {
        // pcap-parser 0.17 subtracts 12 from a pcapng block's length without checking it
        // (a panic in debug builds): refuse such a block here first.
        if pcapng && short_pcapng_block(reader.data(), &mut le) {
            return Err(CaptureError::Format(
                "pcapng block shorter than its own header".into(),
            ));
        }
        match reader.next() {
            Ok((offset, block)) => {
                // A packet on an interface the section did not describe is counted, skipped.
                let on = |if_id: usize, high: u32, low: u32, data| {
                    let iface = interfaces.get(if_id)?;
                    Some((iface.time(high, low), iface.link, data))
                };
                let frame = match block {
                    PcapBlockOwned::LegacyHeader(h) => {
                        legacy_link = h.network;
                        legacy_nanos = h.is_nanosecond_precision();
                        None
                    }
                    PcapBlockOwned::Legacy(b) => {
                        let frac = if legacy_nanos {
                            u64::from(b.ts_usec) / 1000
                        } else {
                            u64::from(b.ts_usec)
                        };
                        let t = Time(u64::from(b.ts_sec) * 1_000_000 + frac);
                        Some(Some((t, legacy_link, captured(b.data, b.caplen))))
                    }
                    PcapBlockOwned::NG(Block::SectionHeader(shb)) => {
                        interfaces.clear();
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
                        Some(on(epb.if_id as usize, epb.ts_high, epb.ts_low, data))
                    }
                    PcapBlockOwned::NG(Block::Unknown(b))
                        if block_type(b.block_type, big_endian) == PACKET_BLOCK =>
                    {
                        let packet = packet_block(b.data, big_endian);
                        Some(packet.and_then(|(id, high, low, data)| on(id, high, low, data)))
                    }
                    PcapBlockOwned::NG(Block::SimplePacket(_)) => {
                        // No timestamp: useless for a time-driven replay.
                        Some(None)
                    }
                    PcapBlockOwned::NG(_) => None,
                };
                // None: not a packet; Some(None): a packet we cannot use.
                if let Some(frame) = frame {
                    stats.frames += 1;
                    match frame.and_then(|(time, link, data)| Some((time, udp_of(data, link)?))) {
                        Some((time, (source, destination, payload))) => {
                            stats.udp += 1;
                            each(Datagram {
                                time,
                                source,
                                destination,
                                payload: payload.to_vec(),
                            });
                        }
                        None => stats.skipped += 1,
                    }
                }
                reader.consume(offset);
            }
            Err(PcapError::Eof) => break,
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
                Err(e) => return Err(CaptureError::Format(format!("{e:?}"))),
            },
            Err(PcapError::BufferTooSmall) => {
                // The next record does not fit: grow, then read on.
                if capacity >= MAX_BUFFER {
                    return Err(CaptureError::Format(format!(
                        "a record of more than {} MiB (a corrupt length?)",
                        MAX_BUFFER >> 20
                    )));
                }
                capacity = (capacity * 2).min(MAX_BUFFER);
                reader.grow(capacity);
                reader
                    .refill()
                    .map_err(|e| CaptureError::Format(format!("{e:?}")))?;
            }
            Err(e) => return Err(CaptureError::Format(format!("{e:?}"))),
        }
    }
    Ok(stats)
}

/// The bytes a record captured: its data cut to its captured length (pcapng pads to 32 bits).
fn captured(data: &[u8], caplen: u32) -> &[u8] {
    let caplen = usize::try_from(caplen).unwrap_or(usize::MAX);
    &data[..caplen.min(data.len())]
}

/// True when the next pcapng block claims a length under 12 bytes (type, two lengths). Tracks
/// the section's byte order from each Section Header Block.
fn short_pcapng_block(data: &[u8], le: &mut bool) -> bool {
    const SHB: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
    if data.len() < 8 {
        return false;
    }
    if data[..4] == SHB && data.len() >= 12 {
        *le = data[8..12] == [0x4d, 0x3c, 0x2b, 0x1a];
    }
    let len = [data[4], data[5], data[6], data[7]];
    let len = if *le {
        u32::from_le_bytes(len)
    } else {
        u32::from_be_bytes(len)
    };
    len < 12
}

fn udp_of(data: &[u8], link: Linktype) -> Option<(SocketAddr, SocketAddr, &[u8])> {
    // Only the link types a T.140 capture comes in; pcap-parser 0.17's decoders for others
    // (Wireshark upper PDU, NFLOG) panic on malformed frames (found by the pcap_read fuzzer).
    let supported = [
        Linktype::ETHERNET,
        Linktype::RAW,
        Linktype::LINUX_SLL,
        Linktype::LINUX_SLL2,
        Linktype::IPV4,
        Linktype::IPV6,
        Linktype::NULL,
    ];
    if !supported.contains(&link) {
        return None;
    }
    let sliced = match get_packetdata(data, link, data.len())? {
        PacketData::L2(frame) => SlicedPacket::from_ethernet(frame).ok()?,
        PacketData::L3(_, packet) => SlicedPacket::from_ip(packet).ok()?,
        PacketData::L4(..) | PacketData::Unsupported(_) => return None,
    };
    let (src, dst): (IpAddr, IpAddr) = match sliced.net? {
        NetSlice::Ipv4(ip) => {
            if ip.is_payload_fragmented() {
                return None;
            }
            (
                ip.header().source_addr().into(),
                ip.header().destination_addr().into(),
            )
        }
        NetSlice::Ipv6(ip) => {
            if ip.is_payload_fragmented() {
                return None;
            }
            (
                ip.header().source_addr().into(),
                ip.header().destination_addr().into(),
            )
        }
        NetSlice::Arp(_) => return None,
    };
    match sliced.transport? {
        TransportSlice::Udp(udp) => Some((
            SocketAddr::new(src, udp.source_port()),
            SocketAddr::new(dst, udp.destination_port()),
            udp.payload(),
        )),
        _ => None,
    }
}
