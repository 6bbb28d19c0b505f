//! The layer under tungstenite that skips a server's messages over the limit
//! (`sink::oversize`): never panics, hands on the same bytes however the reads fall, never
//! more than came, and every frame and message it hands on within the limit.
#![no_main]

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use pvp_t140::sink::oversize::SkipOversize;
use tokio::io::{AsyncRead, ReadBuf};

const RESPONSE: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";
const LIMIT: usize = 300;

/// Hands out its bytes in reads of the sizes given, in turn.
struct Pieces<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    turn: usize,
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let size = match this.sizes {
            [] => usize::MAX,
            s => usize::from(s[this.turn % s.len()]).max(1),
        };
        this.turn += 1;
        let n = size.min(buf.remaining()).min(this.data.len());
        buf.put_slice(&this.data[..n]);
        this.data = &this.data[n..];
        Poll::Ready(Ok(()))
    }
}

/// Everything the layer hands on, read `read_size` bytes at most at a time.
fn read_all(data: &[u8], sizes: &[u8], read_size: usize) -> Vec<u8> {
    let mut s = SkipOversize::new(
        Pieces {
            data,
            sizes,
            turn: 0,
        },
        LIMIT,
    );
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    let mut buf = vec![0; read_size];
    loop {
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(&mut s).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => return out,
            Poll::Ready(Ok(())) => out.extend_from_slice(rb.filled()),
            other => panic!("{other:?}"),
        }
    }
}

/// The first byte (FIN, opcode) and payload length of each data frame in `out` after the
/// handshake (control frames are handed on as they came: tungstenite fails one over 125 bytes).
fn frame_lens(out: &[u8]) -> Vec<(u8, u64)> {
    let mut at = RESPONSE.len();
    let mut lens = Vec::new();
    while out.len().saturating_sub(at) >= 2 {
        let (b1, mut h) = (out[at + 1], 2);
        let len = match b1 & 0x7f {
            126 if out.len() - at >= 4 => {
                h += 2;
                u64::from(u16::from_be_bytes([out[at + 2], out[at + 3]]))
            }
            127 if out.len() - at >= 10 => {
                h += 8;
                u64::from_be_bytes(out[at + 2..at + 10].try_into().unwrap())
            }
            126 | 127 => break,
            n => u64::from(n),
        };
        if b1 & 0x80 != 0 || (b1 & 0x7f == 127 && len >> 63 != 0) {
            // Masked, or a 64-bit length with its top bit set (RFC 6455 5.2): handed on as it
            // came, and tungstenite fails it.
            break;
        }
        if out[at] & 0x0f < 8 {
            lens.push((out[at], len));
        }
        at = match usize::try_from(len)
            .ok()
            .and_then(|l| (at + h).checked_add(l))
        {
            Some(next) => next,
            None => break,
        };
    }
    lens
}

fuzz_target!(|input: &[u8]| {
    let Some((&n, rest)) = input.split_first() else {
        return;
    };
    let (sizes, frames) = rest.split_at(usize::from(n % 8).min(rest.len()));
    let mut data = RESPONSE.to_vec();
    data.extend_from_slice(frames);
    let whole = read_all(&data, &[], 1 << 16);
    assert!(whole.len() <= data.len());
    assert_eq!(whole[..RESPONSE.len()], *RESPONSE);
    assert_eq!(read_all(&data, sizes, 1 << 16), whole, "reads of {sizes:?}");
    assert_eq!(read_all(&data, sizes, 5), whole, "small reads of {sizes:?}");
    // Every frame within the limit, and every message within it and the rest of a character
    // (a message cut in fragments keeps what finishes a character split at the cut).
    let mut message = 0u64;
    for (b0, len) in frame_lens(&whole) {
        assert!(len <= LIMIT as u64, "a frame of {len} handed on");
        if b0 & 0x0f != 0 {
            message = 0;
        }
        message += len;
        assert!(
            message <= LIMIT as u64 + 3,
            "a message of {message} handed on"
        );
    }
});
