//! Captures libpcap and Wireshark read that replay's corrupt-record checks must still read,
//! and blocks it may skip (review h, session 39, of review b's checks).

#[path = "common/frames.rs"]
mod frames;

mod captures {
    //! Valid captures the corrupt-record checks of review b must still read.

    use pvp_t140::capture::{CaptureError, CaptureStats, Datagram, read_udp_from};

    use super::frames::udp_ipv4;

    pub fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&udp_ipv4(
            [10, 0, 0, 1],
            40000,
            [10, 0, 0, 2],
            5004,
            payload,
        ));
        f
    }

    pub fn read(bytes: &[u8]) -> Result<(Vec<Datagram>, CaptureStats), CaptureError> {
        let mut got = Vec::new();
        let stats = read_udp_from(bytes, &mut |d| got.push(d))?;
        Ok((got, stats))
    }

    pub fn payloads(got: &[Datagram]) -> Vec<&[u8]> {
        got.iter().map(|d| d.payload.as_slice()).collect()
    }

    /// Little-endian pcapng.
    pub struct Ng(pub Vec<u8>);

    impl Ng {
        pub fn new() -> Self {
            let mut ng = Ng(Vec::new());
            let mut shb = Vec::new();
            shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
            shb.extend_from_slice(&1u16.to_le_bytes());
            shb.extend_from_slice(&0u16.to_le_bytes());
            shb.extend_from_slice(&u64::MAX.to_le_bytes());
            ng.block(0x0a0d_0d0a, &shb);
            let mut idb = Vec::new();
            idb.extend_from_slice(&1u16.to_le_bytes());
            idb.extend_from_slice(&0u16.to_le_bytes());
            idb.extend_from_slice(&262_144u32.to_le_bytes());
            ng.block(1, &idb);
            ng
        }
        pub fn block(&mut self, kind: u32, body: &[u8]) {
            let len = (12 + body.len()) as u32;
            assert_eq!(len % 4, 0);
            self.0.extend_from_slice(&kind.to_le_bytes());
            self.0.extend_from_slice(&len.to_le_bytes());
            self.0.extend_from_slice(body);
            self.0.extend_from_slice(&len.to_le_bytes());
        }
        /// An EPB with `options` (already padded, end-of-options included) after its data.
        pub fn epb(&mut self, us: u64, data: &[u8], options: &[u8]) {
            let mut body = Vec::new();
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&((us >> 32) as u32).to_le_bytes());
            body.extend_from_slice(&(us as u32).to_le_bytes());
            body.extend_from_slice(&(data.len() as u32).to_le_bytes());
            body.extend_from_slice(&(data.len() as u32).to_le_bytes());
            body.extend_from_slice(data);
            while body.len() % 4 != 0 {
                body.push(0);
            }
            body.extend_from_slice(options);
            self.block(6, &body);
        }
    }

    /// A pcapng with blocks larger than the reader's first buffer (a Decryption Secrets Block
    /// of a long TLS key log, a frame of a jumbo loopback capture), and packets with options
    /// (flags, a comment) after their data: all valid, Wireshark reads them.
    #[test]
    fn a_pcapng_with_large_blocks_and_packet_options_is_read_whole() {
        let mut ng = Ng::new();
        ng.epb(1_000_000, &frame(b"one"), &[]);
        // Decryption Secrets Block (0x0a): type, length, 150 KiB of secrets.
        let mut dsb = Vec::new();
        dsb.extend_from_slice(&0x544c_534bu32.to_le_bytes());
        dsb.extend_from_slice(&(150_000u32).to_le_bytes());
        dsb.extend(std::iter::repeat_n(b'k', 150_000));
        ng.block(0x0a, &dsb);
        // epb_flags (2): inbound; opt_comment (1): 5 bytes, padded; opt_endofopt.
        let mut opts = Vec::new();
        opts.extend_from_slice(&2u16.to_le_bytes());
        opts.extend_from_slice(&4u16.to_le_bytes());
        opts.extend_from_slice(&1u32.to_le_bytes());
        opts.extend_from_slice(&1u16.to_le_bytes());
        opts.extend_from_slice(&5u16.to_le_bytes());
        opts.extend_from_slice(b"hello\0\0\0");
        opts.extend_from_slice(&[0; 4]);
        ng.epb(2_000_000, &frame(b"two"), &opts);
        // A 200,000-byte frame: a datagram and what the capture took after it.
        let mut big = frame(b"three");
        big.resize(200_000, 0xee);
        ng.epb(3_000_000, &big, &[]);
        ng.epb(4_000_000, &frame(b"four"), &[]);
        let (got, stats) = read(&ng.0).expect("a valid capture");
        assert_eq!(
            payloads(&got),
            [&b"one"[..], b"two", b"three", b"four"],
            "{stats:?}"
        );
        assert!(!stats.cut_short);
    }

    /// Classic pcap, little-endian, µs, with the link type field as given.
    fn pcap(link: u32, snaplen: u32, frames: &[Vec<u8>]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        f.extend_from_slice(&2u16.to_le_bytes());
        f.extend_from_slice(&4u16.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&snaplen.to_le_bytes());
        f.extend_from_slice(&link.to_le_bytes());
        for (i, data) in frames.iter().enumerate() {
            f.extend_from_slice(&(i as u32 + 1).to_le_bytes());
            f.extend_from_slice(&0u32.to_le_bytes());
            f.extend_from_slice(&(data.len() as u32).to_le_bytes());
            f.extend_from_slice(&(data.len() as u32).to_le_bytes());
            f.extend_from_slice(data);
        }
        f
    }

    /// A pcap whose link type says every Ethernet frame ends in a 4-byte FCS (the FCS length
    /// in the top bits, the F bit set), with the FCS bytes on the frames; and one whose snap
    /// length is libpcap's largest with a record exactly that long.
    #[test]
    fn a_pcap_with_fcs_bytes_and_one_at_the_largest_snap_length_are_read() {
        let fcs = |p: &[u8]| {
            let mut f = frame(p);
            f.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            f
        };
        let file = pcap(
            (4 << 29) | (1 << 28) | 1,
            65_535,
            &[fcs(b"one"), fcs(b"two")],
        );
        let (got, stats) = read(&file).expect("a valid capture");
        assert_eq!(payloads(&got), [&b"one"[..], b"two"], "{stats:?}");

        let mut max = frame(b"big");
        max.resize(262_144, 0);
        let file = pcap(1, 262_144, &[frame(b"one"), max, frame(b"two")]);
        let (got, stats) = read(&file).expect("a valid capture");
        assert_eq!(payloads(&got), [&b"one"[..], b"big", b"two"], "{stats:?}");
    }
}

/// A Name Resolution Block whose records fill it without the end-of-records record: Wireshark
/// reads the records to the block's end and goes on; replay, which uses no name, refused the
/// whole capture at it as corrupt (exit status 1, the datagrams after it unread). A block
/// replay does not use, whose two Block Total Lengths agree, is skipped whatever its contents.
#[test]
fn a_name_resolution_block_without_its_end_record_is_skipped_not_corrupt() {
    use captures::*;
    let mut ng = Ng::new();
    ng.epb(1_000_000, &frame(b"before"), &[]);
    // One IPv4 record (type 1, 8 bytes: address, "lo\0" padded), no end record.
    let mut nrb = Vec::new();
    nrb.extend_from_slice(&1u16.to_le_bytes());
    nrb.extend_from_slice(&8u16.to_le_bytes());
    nrb.extend_from_slice(&[127, 0, 0, 1, b'l', b'o', 0, 0]);
    ng.block(4, &nrb);
    ng.epb(2_000_000, &frame(b"after"), &[]);
    let (got, stats) = read(&ng.0).expect("Wireshark reads it");
    assert_eq!(payloads(&got), [&b"before"[..], b"after"], "{stats:?}");
}

/// A pcapng whose Section Header Block is larger than the reader's first buffer (64 KiB: a
/// long capture comment, as Wireshark's capture file properties write it) is valid, and
/// Wireshark reads it; replay said "the file ends inside its header".
#[test]
fn a_pcapng_with_a_section_header_longer_than_64_kib_is_read() {
    use captures::*;
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    // opt_comment of 80,000 bytes, then opt_endofopt.
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&40_000u16.to_le_bytes());
    shb.extend(std::iter::repeat_n(b'c', 40_000));
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&40_000u16.to_le_bytes());
    shb.extend(std::iter::repeat_n(b'c', 40_000));
    shb.extend_from_slice(&[0; 4]);
    let rest = Ng::new().0;
    let shb_len = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
    let mut ng = Ng(Vec::new());
    ng.block(0x0a0d_0d0a, &shb);
    ng.0.extend_from_slice(&rest[shb_len..]);
    ng.epb(1_000_000, &frame(b"one"), &[]);
    let (got, stats) = read(&ng.0).expect("a valid capture");
    assert_eq!(payloads(&got), [&b"one"[..]], "{stats:?}");
}
