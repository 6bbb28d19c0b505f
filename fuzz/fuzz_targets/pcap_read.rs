//! pcap/pcapng reading: never panics or hangs, and every datagram handed out fits the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvp_t140::capture::read_udp_from;

fuzz_target!(|data: &[u8]| {
    let mut n = 0u64;
    let mut bytes = 0usize;
    let res = read_udp_from(std::io::Cursor::new(data), &mut |d| {
        n += 1;
        bytes += d.payload.len();
    });
    assert!(bytes <= data.len());
    if let Ok(stats) = res {
        assert_eq!(stats.udp, n);
        // Every frame is a whole datagram, a skipped frame or a fragment; a datagram
        // reassembled from fragments is counted among the datagrams and its frames as fragments.
        assert_eq!(
            stats.udp - stats.reassembled + stats.skipped + stats.fragments,
            stats.frames
        );
        assert!(stats.reassembled <= stats.fragments);
    }
});
