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
use pcap_parser::pcapng::Block;
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
    /// Frames that are not UDP over IP (ARP, TCP, ICMP, fragments, unsupported link types).
    pub skipped: u64,
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

/// As [`read_udp`], from any reader (fuzzing feeds bytes here).
pub fn read_udp_from(
    reader: impl io::Read + Send,
    each: &mut dyn FnMut(Datagram),
) -> Result<CaptureStats, CaptureError> {
    let mut reader =
        create_reader(1 << 16, reader).map_err(|e| CaptureError::Format(format!("{e:?}")))?;
    let mut stats = CaptureStats::default();
    let mut legacy_link = Linktype::ETHERNET;
    let mut legacy_nanos = false;
    // pcapng interfaces of the current section: link type, units per second, offset seconds.
    let mut interfaces: Vec<(Linktype, u64, i64)> = Vec::new();
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
                        Some((t, legacy_link, b.data, b.caplen as usize))
                    }
                    PcapBlockOwned::NG(Block::SectionHeader(_)) => {
                        interfaces.clear();
                        None
                    }
                    PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                        interfaces.push((
                            idb.linktype,
                            idb.ts_resolution().unwrap_or(1_000_000).max(1),
                            idb.ts_offset(),
                        ));
                        None
                    }
                    PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                        match interfaces.get(epb.if_id as usize) {
                            Some(&(link, resol, off)) => {
                                let units = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
                                let us = (u128::from(units) * 1_000_000 / u128::from(resol)) as u64;
                                let us = us.saturating_add_signed(off.saturating_mul(1_000_000));
                                Some((Time(us), link, epb.data, epb.caplen as usize))
                            }
                            None => {
                                stats.frames += 1;
                                stats.skipped += 1;
                                None
                            }
                        }
                    }
                    PcapBlockOwned::NG(Block::SimplePacket(_)) => {
                        // No timestamp: useless for a time-driven replay.
                        stats.frames += 1;
                        stats.skipped += 1;
                        None
                    }
                    PcapBlockOwned::NG(_) => None,
                };
                if let Some((time, link, data, caplen)) = frame {
                    stats.frames += 1;
                    match udp_of(data, link, caplen.min(data.len())) {
                        Some((source, destination, payload)) => {
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
            Err(PcapError::Incomplete(_)) => {
                reader
                    .refill()
                    .map_err(|e| CaptureError::Format(format!("{e:?}")))?;
            }
            Err(e) => return Err(CaptureError::Format(format!("{e:?}"))),
        }
    }
    Ok(stats)
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

fn udp_of(data: &[u8], link: Linktype, caplen: usize) -> Option<(SocketAddr, SocketAddr, &[u8])> {
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
    let sliced = match get_packetdata(data, link, caplen)? {
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
