//! A server's messages over what a participant's connection reads, skipped whole.
//!
//! tungstenite refuses a frame over its `max_frame_size` by failing the connection, the frame's
//! payload left unread, so the stream cannot go on. A PVP server may send one (another member's
//! inline `image` or `file` context, pvp-spec 9.1), and one that replays its history to each
//! joiner (pvp-spec 19.1) sends it again after every reconnect: the participant reconnected for
//! ever, its pings unanswered. This layer sits under tungstenite and reads the WebSocket framing
//! (RFC 6455 5.2) as it passes: a data frame over the limit is handed on as an empty *binary*
//! frame and its payload discarded as it arrives, so memory stays bounded and the connection
//! goes on. The connection counts the empty frame as a rejected one (pvp-spec 19.1: an envelope
//! a text frame) and asks [`SkipOversize::take_skipped`] for the size to log.
//!
//! A message the server cuts into frames, each under the limit but over it in all, is cut where
//! it crosses the limit: the frames before are passed, the rest discarded (the frame that
//! crosses passes the 0-3 bytes that finish a character split at the cut, so a text message
//! stays UTF-8, which tungstenite checks), and the connection reads a shorter message that
//! does not parse as an envelope and is counted as rejected. Left as before: masked frames (a
//! server must not mask, RFC 6455 5.1) and 64-bit lengths with the top bit set (RFC 6455
//! 5.2); tungstenite fails them.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask (RFC 6455 5.2).
const HEADER_MAX: usize = 14;

/// Where in the byte stream the next byte falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// The handshake's HTTP response, passed whole; how much of its closing CRLF CRLF has
    /// been seen.
    Handshake(u8),
    /// A frame header (held in `hdr` until whole).
    Header,
    /// A frame's payload: how much of it is left, how much of that is passed (the rest is
    /// discarded), and whether the passed bytes are a text message's (their UTF-8 tracked).
    Payload { left: u64, pass: u64, text: bool },
}

/// A stream under tungstenite that turns data frames over `limit` into empty binary frames.
pub struct SkipOversize<S> {
    inner: S,
    limit: u64,
    at: At,
    /// A header read so far.
    hdr: [u8; HEADER_MAX],
    hdr_len: usize,
    /// A header to hand on before anything else (one that arrived split across reads).
    out: [u8; HEADER_MAX],
    out_len: usize,
    out_pos: usize,
    /// The current fragmented message is being discarded: its later frames are too.
    discarding: bool,
    /// Payload bytes of the current data message passed so far.
    passed: u64,
    /// The current data message is text (RFC 6455 5.6: UTF-8, checked by tungstenite).
    text: bool,
    /// Continuation bytes the last character passed still owes (UTF-8, RFC 3629 3).
    owed: u8,
    /// The size of the last frame discarded, until the connection asks for it.
    skipped: Option<u64>,
    /// Bytes came from the server since the connection last asked ([`SkipOversize::take_read`]).
    read: bool,
}

impl<S> SkipOversize<S> {
    /// `inner` before the WebSocket handshake: the HTTP response is passed whole.
    pub fn new(inner: S, limit: usize) -> Self {
        SkipOversize {
            inner,
            limit: limit as u64,
            at: At::Handshake(0),
            hdr: [0; HEADER_MAX],
            hdr_len: 0,
            out: [0; HEADER_MAX],
            out_len: 0,
            out_pos: 0,
            discarding: false,
            passed: 0,
            text: false,
            owed: 0,
            skipped: None,
            read: false,
        }
    }

    /// Whether any bytes came from the server since the last call: a frame still arriving
    /// (a large one over a slow link, passed or discarded) is the server heard from, though
    /// no whole frame has come.
    pub fn take_read(&mut self) -> bool {
        std::mem::take(&mut self.read)
    }

    /// The size of the message last discarded or cut, once.
    pub fn take_skipped(&mut self) -> Option<u64> {
        self.skipped.take()
    }

    /// The header in `hdr` is whole: the header to hand on in its place, its length, and what
    /// follows it.
    fn decide(&mut self) -> ([u8; HEADER_MAX], usize) {
        let h = &self.hdr[..self.hdr_len];
        let len = payload_len(h);
        let opcode = h[0] & 0x0f;
        let fin = h[0] & 0x80;
        let masked = h[1] & 0x80 != 0;
        // RFC 6455 5.2: a 64-bit length's most significant bit must be 0. Such a frame, like a
        // masked one, is a server's error that fails the connection: passed on for tungstenite
        // to fail (skipped, its claimed 2^63 bytes would swallow all the server sent after,
        // its pings and errors, until the silence timeout).
        let malformed = masked || (h[1] & 0x7f == 127 && h[2] & 0x80 != 0);
        let data = opcode < 8;
        if data && opcode != 0 {
            // A message's first frame.
            self.discarding = false;
            (self.passed, self.text, self.owed) = (0, opcode == 1, 0);
        }
        // Control frames (at most 125 bytes, and allowed between a message's fragments) pass
        // and leave the message being discarded as it is.
        let over = self.passed.saturating_add(len) > self.limit;
        let skip = data && !malformed && (self.discarding || over);
        let mut out = [0; HEADER_MAX];
        let (n, pass) = if skip {
            // Binary for a message's first frame: an empty text frame would be read as an
            // envelope that does not parse, and nothing of it was passed. A continuation keeps
            // its opcode and passes what finishes a character cut at the limit. Either way the
            // frame's FIN.
            if opcode != 0 {
                self.text = false;
            }
            let pass = if self.text {
                len.min(u64::from(self.owed))
            } else {
                0
            };
            out[0] = fin | if opcode == 0 { 0 } else { 2 };
            out[1] = pass as u8;
            // The message's size: what was passed of it before the cut, and every frame after.
            let before = if self.discarding { 0 } else { self.passed };
            self.discarding = fin == 0;
            self.skipped = Some(
                self.skipped
                    .unwrap_or(0)
                    .saturating_add(before)
                    .saturating_add(len),
            );
            (2, pass)
        } else {
            out[..h.len()].copy_from_slice(h);
            if data {
                // Saturating: a malformed frame (passed, for tungstenite to fail) may claim 2^64.
                self.passed = self.passed.saturating_add(len);
            }
            (h.len(), len)
        };
        self.at = At::Payload {
            left: len,
            pass,
            text: data && self.text,
        };
        (out, n)
    }

    /// The UTF-8 state after `passed`, bytes of a text message handed on.
    fn track(&mut self, passed: &[u8]) {
        for &b in passed {
            self.owed = match b {
                0x80..=0xbf => self.owed.saturating_sub(1),
                0xf0.. => 3,
                0xe0.. => 2,
                0xc0.. => 1,
                _ => 0,
            };
        }
    }

    /// Passes, rewrites or drops the bytes just read, in place; how many are left to hand on.
    /// A header not yet whole at the end is held in `hdr`.
    fn filter(&mut self, data: &mut [u8]) -> usize {
        let (mut r, mut w) = (0, 0);
        while r < data.len() {
            match self.at {
                At::Handshake(seen) => {
                    let b = data[r];
                    data[w] = b;
                    r += 1;
                    w += 1;
                    let seen = if b == b"\r\n\r\n"[usize::from(seen)] {
                        seen + 1
                    } else {
                        u8::from(b == b'\r')
                    };
                    self.at = if seen == 4 {
                        At::Header
                    } else {
                        At::Handshake(seen)
                    };
                }
                At::Header => {
                    self.hdr[self.hdr_len] = data[r];
                    self.hdr_len += 1;
                    r += 1;
                    if self.hdr_len == header_len(&self.hdr[..self.hdr_len]) {
                        // Every byte of this header came in this read (one split across reads
                        // is finished in `poll_read`), so the header handed on, never longer,
                        // fits where it was.
                        let (out, n) = self.decide();
                        data[w..w + n].copy_from_slice(&out[..n]);
                        w += n;
                        self.hdr_len = 0;
                        self.settle();
                    }
                }
                At::Payload { left, pass, text } => {
                    let n = (data.len() - r).min(usize::try_from(left).unwrap_or(usize::MAX));
                    let p = n.min(usize::try_from(pass).unwrap_or(usize::MAX));
                    if p > 0 {
                        if w != r {
                            data.copy_within(r..r + p, w);
                        }
                        if text {
                            self.track(&data[w..w + p]);
                        }
                        w += p;
                    }
                    r += n;
                    self.at = At::Payload {
                        left: left - n as u64,
                        pass: pass - p as u64,
                        text,
                    };
                    self.settle();
                }
            }
        }
        w
    }

    /// A payload read to its end is followed by the next header.
    fn settle(&mut self) {
        if let At::Payload { left: 0, .. } = self.at {
            self.at = At::Header;
        }
    }
}

/// How long the header starting with `h` is (2 until its second byte is known).
fn header_len(h: &[u8]) -> usize {
    if h.len() < 2 {
        return 2;
    }
    let ext = match h[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
    2 + ext + mask
}

/// The payload length of the whole header `h`.
fn payload_len(h: &[u8]) -> u64 {
    match h[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
        127 => u64::from_be_bytes(h[2..10].try_into().expect("8 bytes")),
        n => u64::from(n),
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SkipOversize<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out_len {
                let n = buf.remaining().min(this.out_len - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.hdr_len > 0 {
                // A header split across reads: the rest of it is read alone, so that the
                // header handed on goes out before anything after it.
                let need = header_len(&this.hdr[..this.hdr_len]);
                let mut rest = ReadBuf::new(&mut this.hdr[this.hdr_len..need]);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rest))?;
                let n = rest.filled().len();
                this.read |= n > 0;
                if n == 0 {
                    // The stream ends inside a header: tungstenite is handed what came, and
                    // reports the cut.
                    this.out[..this.hdr_len].copy_from_slice(&this.hdr[..this.hdr_len]);
                    (this.out_len, this.out_pos) = (this.hdr_len, 0);
                    this.hdr_len = 0;
                    this.at = At::Payload {
                        left: u64::MAX,
                        pass: u64::MAX,
                        text: false,
                    };
                    continue;
                }
                this.hdr_len += n;
                if this.hdr_len == header_len(&this.hdr[..this.hdr_len]) {
                    let (out, len) = this.decide();
                    this.out = out;
                    (this.out_len, this.out_pos) = (len, 0);
                    this.hdr_len = 0;
                    this.settle();
                }
                continue;
            }
            let start = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let end = buf.filled().len();
            if end == start {
                return Poll::Ready(Ok(()));
            }
            this.read = true;
            let kept = this.filter(&mut buf.filled_mut()[start..end]);
            buf.set_filled(start + kept);
            if kept > 0 {
                return Poll::Ready(Ok(()));
            }
            // All of it discarded or held: read on (a read of nothing means the end).
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SkipOversize<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Hands out its bytes in reads of the sizes given, in turn.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        turn: usize,
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let size = this.sizes[this.turn % this.sizes.len()];
            this.turn += 1;
            let n = size.min(buf.remaining()).min(this.data.len() - this.at);
            buf.put_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// A server's frame (unmasked): FIN and opcode, payload.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![u8::from(fin) << 7 | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n <= 0xffff => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    const RESPONSE: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    fn read_all(data: Vec<u8>, sizes: Vec<usize>, limit: usize) -> Vec<u8> {
        let pieces = Pieces {
            data,
            at: 0,
            sizes,
            turn: 0,
        };
        let mut s = SkipOversize::new(pieces, limit);
        let mut out = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(s.read_to_end(&mut out)).unwrap();
        out
    }

    #[test]
    fn frames_over_the_limit_become_empty_binary_frames_however_the_reads_fall() {
        let big = vec![b'x'; 70_000];
        let mut input = RESPONSE.to_vec();
        let mut want = RESPONSE.to_vec();
        let parts: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (frame(true, 1, b"{\"a\":1}"), frame(true, 1, b"{\"a\":1}")),
            (frame(true, 1, &big), vec![0x82, 0]),
            (frame(true, 9, b"ping"), frame(true, 9, b"ping")),
            (frame(true, 1, &big[..300]), frame(true, 1, &big[..300])),
            // A fragmented message whose first frame is too large: all of it discarded, a
            // ping between its fragments passed.
            (frame(false, 1, &big), vec![0x02, 0]),
            (frame(true, 9, b""), frame(true, 9, b"")),
            (frame(false, 0, b"abc"), vec![0x00, 0]),
            (frame(true, 0, b"def"), vec![0x80, 0]),
            (frame(true, 2, &big), vec![0x82, 0]),
            (frame(true, 1, b"after"), frame(true, 1, b"after")),
        ];
        for (i, w) in &parts {
            input.extend_from_slice(i);
            want.extend_from_slice(w);
        }
        for sizes in [
            vec![1],
            vec![2],
            vec![3, 1],
            vec![7, 13, 1],
            vec![4096],
            vec![65_536],
            vec![1, 4096, 9],
        ] {
            assert_eq!(
                read_all(input.clone(), sizes.clone(), 1 << 16),
                want,
                "reads of {sizes:?}"
            );
        }
    }

    /// A message cut into frames each under the limit, over it in all: the frames before the
    /// crossing one pass, the crossing one passes the bytes that finish a character split
    /// there, every later one passes empty with its FIN; what was passed stays UTF-8.
    #[test]
    fn a_message_over_the_limit_in_fragments_is_cut_at_a_character() {
        let limit = 1 << 16;
        // Text: the limit falls after the first byte of a 3-byte character.
        let mut first = vec![b'a'; limit - 1];
        first.push(0xe2);
        let mut crossing = vec![0x82, 0xac];
        crossing.extend_from_slice(&[b'b'; 100]);
        let mut input = RESPONSE.to_vec();
        let mut want = RESPONSE.to_vec();
        let parts: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (frame(false, 1, &first), frame(false, 1, &first)),
            (frame(false, 0, &crossing), frame(false, 0, &[0x82, 0xac])),
            (frame(true, 9, b"ping"), frame(true, 9, b"ping")),
            (frame(false, 0, b"more"), vec![0x00, 0]),
            (frame(true, 0, b"end"), vec![0x80, 0]),
            (frame(true, 1, b"next"), frame(true, 1, b"next")),
            // Binary: nothing owed, nothing of the crossing frame passed.
            (frame(false, 2, &first), frame(false, 2, &first)),
            (frame(true, 0, &crossing), vec![0x80, 0]),
            // Fragments within the limit in all pass whole.
            (
                frame(false, 1, &first[..limit / 2]),
                frame(false, 1, &first[..limit / 2]),
            ),
            (
                frame(true, 0, &first[limit / 2..limit - 1]),
                frame(true, 0, &first[limit / 2..limit - 1]),
            ),
        ];
        for (i, w) in &parts {
            input.extend_from_slice(i);
            want.extend_from_slice(w);
        }
        for sizes in [
            vec![1],
            vec![3, 1],
            vec![7, 13, 1],
            vec![4096],
            vec![65_536],
        ] {
            assert_eq!(
                read_all(input.clone(), sizes.clone(), limit),
                want,
                "reads of {sizes:?}"
            );
        }
    }

    #[test]
    fn a_stream_cut_inside_a_header_hands_on_what_came() {
        let mut input = RESPONSE.to_vec();
        input.extend_from_slice(&frame(true, 1, b"ok"));
        let whole = input.clone();
        input.extend_from_slice(&[0x81, 127, 0, 0]);
        for sizes in [vec![1], vec![4096]] {
            let out = read_all(input.clone(), sizes, 1 << 16);
            assert_eq!(out[..whole.len()], whole[..]);
            assert_eq!(out[whole.len()..], [0x81, 127, 0, 0]);
        }
    }

    /// A client over `io` as a participant's connection is (`ws::connect`): this layer at 1 MiB,
    /// tungstenite's frame limit the same, its message limit 3 bytes over (a character's rest).
    async fn client(
        io: tokio::io::DuplexStream,
    ) -> tokio_tungstenite::WebSocketStream<SkipOversize<tokio::io::DuplexStream>> {
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some((1 << 20) + 3))
            .max_frame_size(Some(1 << 20));
        let io = SkipOversize::new(io, 1 << 20);
        let (ws, _) =
            tokio_tungstenite::client_async_with_config("ws://localhost/", io, Some(config))
                .await
                .unwrap();
        ws
    }

    /// End to end through tungstenite: a server sends a message over the limit, then a small
    /// one; the client reads an empty binary message, then the small one, on one connection.
    #[tokio::test]
    async fn tungstenite_reads_on_after_a_message_over_the_limit() {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let (client_io, server) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut ws = tokio_tungstenite::accept_async(server).await.unwrap();
            ws.send(Message::text("x".repeat(3 << 20))).await.unwrap();
            ws.send(Message::text("{\"small\":true}")).await.unwrap();
            ws
        });
        let mut ws = client(client_io).await;
        let first = ws.next().await.unwrap().unwrap();
        assert_eq!(first, Message::Binary(Default::default()));
        assert_eq!(ws.get_mut().take_skipped(), Some(3 << 20));
        let second = ws.next().await.unwrap().unwrap();
        assert_eq!(second, Message::text("{\"small\":true}"));
        assert_eq!(ws.get_mut().take_skipped(), None);
        drop(server.await.unwrap());
    }

    /// End to end through tungstenite: a text message of 3-byte characters cut by the server
    /// into 64 KiB frames, 3 MiB in all, reads as a shorter text message (UTF-8, within the
    /// limit and a character), then the next message, on one connection.
    #[tokio::test]
    async fn tungstenite_reads_a_fragmented_message_over_the_limit_cut_short() {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::protocol::frame::Frame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        let text = "€".repeat(1 << 20);
        let (client_io, server) = tokio::io::duplex(64 * 1024);
        let sent = text.clone();
        let server = tokio::spawn(async move {
            let mut ws = tokio_tungstenite::accept_async(server).await.unwrap();
            let pieces: Vec<&[u8]> = sent.as_bytes().chunks(64 << 10).collect();
            for (i, p) in pieces.iter().enumerate() {
                let op = OpCode::Data(if i == 0 { Data::Text } else { Data::Continue });
                let frame = Frame::message(p.to_vec(), op, i + 1 == pieces.len());
                ws.feed(Message::Frame(frame)).await.unwrap();
            }
            ws.send(Message::text("{\"small\":true}")).await.unwrap();
            ws
        });
        let mut ws = client(client_io).await;
        let Message::Text(cut) = ws.next().await.unwrap().unwrap() else {
            panic!("a text message");
        };
        assert!(
            cut.len() <= (1 << 20) + 3 && cut.len() > (1 << 20) - 3,
            "{}",
            cut.len()
        );
        assert!(text.starts_with(cut.as_str()));
        assert_eq!(ws.get_mut().take_skipped(), Some(3 << 20));
        let second = ws.next().await.unwrap().unwrap();
        assert_eq!(second, Message::text("{\"small\":true}"));
        drop(server.await.unwrap());
    }
}
