//! Reading a socket's datagrams a batch per system call.
//!
//! On Linux a batch is one `recvmmsg(2)`. Measured on the project's machine (docs/performance.md,
//! section 14): draining 300,000 queued datagrams on one core took 0.94-0.95 µs of CPU a
//! datagram with a `recvfrom` each and 0.76-0.79 µs with `recvmmsg` 16, 32 or 64 at a time. The
//! system call's entry and exit, the file lookup and the security hooks are paid per call
//! rather than per datagram. Elsewhere a batch is read with one `recv_from` per datagram.
//!
//! Each datagram of a batch has a slot of its own. The slots sit side by side, so a batch of
//! typical T.140 packets (tens to hundreds of bytes) lands in a few cache lines of each slot
//! and the core borrows them there. A datagram longer than a slot continues into an overflow
//! area behind that slot, which is otherwise never touched (its pages are never faulted in),
//! and is joined into one piece for the core: nothing a socket can carry is cut short.

use std::io;
use std::net::SocketAddr;

/// Datagrams read in one batch: as many as the core warms together
/// ([`crate::gateway::WARM_BATCH`]).
pub const BATCH: usize = crate::gateway::WARM_BATCH;

/// A slot holds a datagram of up to this many bytes whole; longer ones continue into the
/// overflow. RFC 4103 text packets are small: a 300 ms buffer of typing, three RED generations.
const SLOT: usize = 2048;
/// Slots are one cache line more than [`SLOT`] apart, so the starts of a batch's slots fall in
/// different cache sets rather than all in the same few.
const STRIDE: usize = SLOT + 64;
/// The largest UDP payload (IPv4's 65,507 bytes, IPv6's 65,527) fits a slot and its overflow.
const LARGEST: usize = 65_536;

#[cfg(any(target_os = "linux", target_os = "android"))]
const OVERFLOW: usize = BATCH * (LARGEST - SLOT);
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const OVERFLOW: usize = LARGEST;

/// Reads in a row without a datagram longer than a slot, after one, before the memory long
/// datagrams used is given back ([`BatchReader::give_back`]). Long enough that traffic mixing
/// them does not reallocate over and over; short enough that a flood's 2 + 2 MiB do not stay
/// for the worker's life.
const RELEASE_AFTER: u32 = 1024;

/// Fills the unused entries of a batch.
const UNSPECIFIED: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

/// Where a datagram of the last batch is.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// In slot `.0`: its first `.1` bytes.
    Slot(usize, usize),
    /// Joined from its slot and overflow into `joined[.0...0 + .1]`.
    Joined(usize, usize),
}

/// Slot `i`'s first `len` bytes, in [`BatchReader::slots`].
fn slot(i: usize, len: usize) -> std::ops::Range<usize> {
    i * STRIDE..i * STRIDE + len
}

/// The datagrams of the last read, in the order they were read, borrowed from the reader: a
/// slice of (source, bytes) through `Deref`.
pub struct Datagrams<'a> {
    views: [(SocketAddr, &'a [u8]); BATCH],
    n: usize,
}

impl<'a> std::ops::Deref for Datagrams<'a> {
    type Target = [(SocketAddr, &'a [u8])];
    fn deref(&self) -> &Self::Target {
        &self.views[..self.n]
    }
}

/// Reads a socket's datagrams a batch at a time into buffers allocated once, so reading
/// allocates nothing per datagram (a datagram longer than a slot, 2 KiB, may grow the joining
/// buffer, which is given back after 1,024 reads without one).
pub struct BatchReader {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    headers: nix::sys::socket::MultiHeaders<nix::sys::socket::SockaddrStorage>,
    slots: Box<[u8]>,
    /// Linux: each slot's overflow. Elsewhere: where one datagram is read before it is placed.
    overflow: Box<[u8]>,
    joined: Vec<u8>,
    got: [(SocketAddr, Place); BATCH],
    n: usize,
    /// Reads since the last one with a long datagram; `None` once the memory is given back (or
    /// before any long datagram).
    since_long: Option<u32>,
    /// A socket error the one-at-a-time fallback met after datagrams of its batch, which the
    /// next read reports ([`BatchReader::read_each`]).
    error: Option<io::Error>,
}

impl std::fmt::Debug for BatchReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchReader").field("n", &self.n).finish()
    }
}

impl Default for BatchReader {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchReader {
    pub fn new() -> Self {
        BatchReader {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            headers: nix::sys::socket::MultiHeaders::preallocate(BATCH, None),
            slots: vec![0u8; BATCH * STRIDE].into_boxed_slice(),
            // Zeroed by the allocator's fresh pages: only a long datagram ever touches them.
            overflow: vec![0u8; OVERFLOW].into_boxed_slice(),
            joined: Vec::new(),
            got: [(UNSPECIFIED, Place::Slot(0, 0)); BATCH],
            n: 0,
            since_long: None,
            error: None,
        }
    }

    /// Reads up to `max` (at most [`BATCH`]) datagrams the socket has ready, without waiting.
    /// Returns how many; `WouldBlock` when there were none, which also tells tokio the socket
    /// is drained, so that its next `readable()` waits. The datagrams stay until the next read
    /// ([`BatchReader::datagrams`]).
    pub fn read(&mut self, socket: &tokio::net::UdpSocket, max: usize) -> io::Result<usize> {
        self.read_by(socket, max, Self::read_now)
    }

    /// [`BatchReader::read`] whatever tokio last learnt of the socket's readiness: what the
    /// socket holds now, read without waiting. Out of the receive loop's way (a stop, an RTCP
    /// datagram that must follow the RTP queued before it): tokio learns of queued datagrams
    /// only when its reactor runs, and [`BatchReader::read`] finds nothing until then. Where
    /// `recvmmsg` is missing this is [`BatchReader::read`].
    pub fn read_ignoring_readiness(
        &mut self,
        socket: &tokio::net::UdpSocket,
        max: usize,
    ) -> io::Result<usize> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            self.n = 0;
            self.joined.clear();
            let n = self.read_now(socket, max.clamp(1, BATCH))?;
            self.n = n;
            self.count_long();
            Ok(n)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        self.read(socket, max)
    }

    /// [`BatchReader::read`], with the reading done by `how`.
    fn read_by(
        &mut self,
        socket: &tokio::net::UdpSocket,
        max: usize,
        how: fn(&mut Self, &tokio::net::UdpSocket, usize) -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.n = 0;
        self.joined.clear();
        let max = max.clamp(1, BATCH);
        let n = socket.try_io(tokio::io::Interest::READABLE, || how(self, socket, max))?;
        self.n = n;
        self.count_long();
        Ok(n)
    }

    /// After each read: a long datagram (it was joined) starts the count, and
    /// [`RELEASE_AFTER`] reads without one give the memory back.
    fn count_long(&mut self) {
        self.since_long = match (self.joined.is_empty(), self.since_long) {
            (false, _) => Some(0),
            (true, Some(k)) if k + 1 >= RELEASE_AFTER => {
                self.give_back();
                None
            }
            (true, k) => k.map(|k| k + 1),
        };
    }

    /// Frees the joining buffer (a flood of long datagrams grows it up to 2 MiB) and, on Linux,
    /// replaces the overflow with fresh memory: the pages long datagrams were written to stay
    /// resident until their allocation is freed (the crate uses no `unsafe`, so no
    /// `madvise`). The new overflow's pages, like the first one's, are only faulted in by a
    /// long datagram. Called after a read that had no long datagram, so neither buffer holds
    /// one of its datagrams.
    #[cold]
    fn give_back(&mut self) {
        self.joined = Vec::new();
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            self.overflow = vec![0u8; OVERFLOW].into_boxed_slice();
        }
    }

    /// Whether memory used for long datagrams is still held (tests): the joining buffer keeps
    /// its capacity from the first long datagram until [`BatchReader::give_back`].
    #[cfg(test)]
    fn holds_long(&self) -> bool {
        self.joined.capacity() > 0
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn read_now(&mut self, socket: &tokio::net::UdpSocket, max: usize) -> io::Result<usize> {
        self.read_each(socket, max)
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn read_now(&mut self, socket: &tokio::net::UdpSocket, max: usize) -> io::Result<usize> {
        use nix::sys::socket::{MsgFlags, recvmmsg};
        use std::io::IoSliceMut;
        use std::os::fd::AsRawFd;
        let BatchReader {
            headers,
            slots,
            overflow,
            joined,
            got,
            ..
        } = self;
        let mut n = 0;
        // Datagrams longer than a slot: where each goes in `got`, its slot and its length.
        let (mut split, mut splits) = ([(0, 0, 0); BATCH], 0);
        {
            // Each datagram: its slot, then its overflow, as one scatter list.
            let mut slots = slots.chunks_exact_mut(STRIDE);
            let mut over = overflow.chunks_exact_mut(LARGEST - SLOT);
            let mut iovs: [[IoSliceMut<'_>; 2]; BATCH] = std::array::from_fn(|_| {
                [
                    IoSliceMut::new(slots.next().map_or(&mut [][..], |s| &mut s[..SLOT])),
                    IoSliceMut::new(over.next().unwrap_or(&mut [][..])),
                ]
            });
            let results = recvmmsg(
                socket.as_raw_fd(),
                headers,
                iovs[..max].iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            )
            .map_err(io::Error::from)?;
            for (i, m) in results.enumerate() {
                // A datagram without an address the gateway can key on (not seen on a UDP
                // socket) is read and passed over.
                let Some(source) = m.address.as_ref().and_then(socket_addr) else {
                    continue;
                };
                // A longer one is placed once joined, below.
                got[n] = (source, Place::Slot(i, m.bytes.min(SLOT)));
                if m.bytes > SLOT {
                    split[splits] = (n, i, m.bytes);
                    splits += 1;
                }
                n += 1;
            }
        }
        // Rare: a datagram longer than a slot is joined with its overflow, whole.
        for &(k, i, len) in &split[..splits] {
            let start = joined.len();
            joined.extend_from_slice(&slots[slot(i, SLOT)]);
            let rest = i * (LARGEST - SLOT);
            joined.extend_from_slice(&overflow[rest..rest + (len - SLOT)]);
            got[k].1 = Place::Joined(start, len);
        }
        Ok(n)
    }

    /// One `recv_from` per datagram, into a buffer of the largest size, then copied to its
    /// place: where `recvmmsg` is missing. Compiled everywhere, so Linux tests it too.
    #[cfg_attr(
        all(any(target_os = "linux", target_os = "android"), not(test)),
        allow(dead_code)
    )]
    fn read_each(&mut self, socket: &tokio::net::UdpSocket, max: usize) -> io::Result<usize> {
        self.read_each_by(max, |buf| socket.try_recv_from(buf))
    }

    /// [`BatchReader::read_each`], with each datagram received by `recv`.
    #[cfg_attr(
        all(any(target_os = "linux", target_os = "android"), not(test)),
        allow(dead_code)
    )]
    fn read_each_by(
        &mut self,
        max: usize,
        mut recv: impl FnMut(&mut [u8]) -> io::Result<(usize, SocketAddr)>,
    ) -> io::Result<usize> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let mut n = 0;
        while n < max {
            let whole = &mut self.overflow[..LARGEST];
            match recv(whole) {
                Ok((len, source)) => {
                    self.got[n] = if len > SLOT {
                        let start = self.joined.len();
                        self.joined.extend_from_slice(&whole[..len]);
                        (source, Place::Joined(start, len))
                    } else {
                        self.slots[slot(n, len)].copy_from_slice(&whole[..len]);
                        (source, Place::Slot(n, len))
                    };
                    n += 1;
                }
                Err(e) if n == 0 => return Err(e),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A socket error after datagrams (BSD and macOS report one only once no
                // datagram is queued): read and cleared, so it is the next read's to report.
                Err(e) => {
                    self.error = Some(e);
                    break;
                }
            }
        }
        Ok(n)
    }

    /// The datagrams of the last read, in the order they were read, borrowed.
    pub fn datagrams(&self) -> Datagrams<'_> {
        let mut views = [(UNSPECIFIED, &[][..]); BATCH];
        for (v, &(source, place)) in views.iter_mut().zip(&self.got[..self.n]) {
            let data = match place {
                Place::Slot(i, len) => &self.slots[slot(i, len)],
                Place::Joined(start, len) => &self.joined[start..start + len],
            };
            *v = (source, data);
        }
        Datagrams { views, n: self.n }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn socket_addr(s: &nix::sys::socket::SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    s.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads until `want` datagrams have arrived, in batches, as the receive loop does.
    async fn read_all(
        socket: &tokio::net::UdpSocket,
        reader: &mut BatchReader,
        want: usize,
    ) -> (Vec<(SocketAddr, Vec<u8>)>, Vec<usize>) {
        read_all_with(socket, reader, want, false).await
    }

    /// [`read_all`], with `each`: through the one-at-a-time fallback instead.
    async fn read_all_with(
        socket: &tokio::net::UdpSocket,
        reader: &mut BatchReader,
        want: usize,
        each: bool,
    ) -> (Vec<(SocketAddr, Vec<u8>)>, Vec<usize>) {
        let (mut got, mut batches) = (Vec::new(), Vec::new());
        while got.len() < want {
            socket.readable().await.unwrap();
            let r = if each {
                reader.read_by(socket, BATCH, BatchReader::read_each)
            } else {
                reader.read(socket, BATCH)
            };
            match r {
                Ok(_) => {
                    let batch = reader.datagrams();
                    batches.push(batch.len());
                    got.extend(batch.iter().map(|(s, d)| (*s, d.to_vec())));
                }
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
        (got, batches)
    }

    #[tokio::test]
    async fn datagrams_of_every_size_arrive_whole_in_order_with_their_sources() {
        every_size(false).await;
    }

    #[tokio::test]
    async fn the_fallback_reads_every_size_whole_too() {
        every_size(true).await;
    }

    async fn every_size(each: bool) {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Around the slot's size, two long ones in one batch (each joined from its own
        // overflow), and the largest IPv4 payload.
        let sizes = [
            0,
            1,
            60,
            SLOT - 1,
            SLOT,
            SLOT + 1,
            5_000,
            9_000,
            40,
            65_507,
            3,
        ];
        let mut sent = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
            let from = if i % 2 == 0 { &a } else { &b };
            from.send_to(&data, to).unwrap();
            sent.push((from.local_addr().unwrap(), data));
        }
        let mut reader = BatchReader::new();
        let (got, _) = read_all_with(&rx, &mut reader, sent.len(), each).await;
        assert_eq!(got.len(), sent.len());
        for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(g.0, s.0, "source of datagram {i}");
            assert_eq!(g.1.len(), s.1.len(), "length of datagram {i}");
            assert!(g.1 == s.1, "bytes of datagram {i}");
        }
        // Nothing left: the socket reports itself drained.
        let e = reader.read(&rx, BATCH).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[tokio::test]
    async fn a_read_takes_at_most_a_batch_or_what_it_is_asked_for() {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let total = BATCH * 2 + 5;
        for i in 0..total {
            tx.send_to(&(i as u32).to_be_bytes(), to).unwrap();
        }
        let mut reader = BatchReader::new();
        rx.readable().await.unwrap();
        // Asked for 3: 3, the first three.
        let n = reader.read(&rx, 3).unwrap();
        assert_eq!(n, 3);
        let batch = reader.datagrams();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[2].1, &2u32.to_be_bytes()[..]);
        // The rest, never more than a batch at a time, in order.
        let (rest, batches) = read_all(&rx, &mut reader, total - 3).await;
        assert!(batches.iter().all(|&n| n <= BATCH), "{batches:?}");
        let numbers: Vec<u32> = rest
            .iter()
            .map(|(_, d)| u32::from_be_bytes(d[..4].try_into().unwrap()))
            .collect();
        assert_eq!(numbers, (3..total as u32).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn ipv6_sources_are_kept() {
        // A machine without IPv6 loopback (some containers) has nothing to check here.
        let Ok(rx) = tokio::net::UdpSocket::bind("[::1]:0").await else {
            eprintln!("no IPv6 loopback: skipped");
            return;
        };
        let tx = std::net::UdpSocket::bind("[::1]:0").unwrap();
        tx.send_to(b"hello", rx.local_addr().unwrap()).unwrap();
        let (got, _) = read_all(&rx, &mut BatchReader::new(), 1).await;
        assert_eq!(got, vec![(tx.local_addr().unwrap(), b"hello".to_vec())]);
    }

    /// A long datagram's memory is given back after [`RELEASE_AFTER`] reads without one, and a
    /// long datagram after that still arrives whole.
    #[tokio::test]
    async fn memory_for_long_datagrams_is_given_back_when_they_stop() {
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let long: Vec<u8> = (0..30_000).map(|k| (k % 251) as u8).collect();
        let mut reader = BatchReader::new();
        assert!(!reader.holds_long());
        tx.send_to(&long, to).unwrap();
        let (got, _) = read_all(&rx, &mut reader, 1).await;
        assert!(got[0].1 == long);
        assert!(reader.holds_long());
        // One short datagram a read: the count is of reads, not datagrams.
        for i in 0..RELEASE_AFTER {
            tx.send_to(&i.to_be_bytes(), to).unwrap();
            let (got, _) = read_all(&rx, &mut reader, 1).await;
            assert_eq!(got[0].1, i.to_be_bytes());
            assert_eq!(
                reader.holds_long(),
                i + 1 < RELEASE_AFTER,
                "after {} reads",
                i + 1
            );
        }
        tx.send_to(&long, to).unwrap();
        let (got, _) = read_all(&rx, &mut reader, 1).await;
        assert!(got[0].1 == long, "whole after the release");
        assert!(reader.holds_long());
    }

    /// Found by review ar (session 46). BSD's and macOS's `soreceive` report a pending socket
    /// error (ECONNREFUSED from an ICMP port unreachable) only once no datagram is queued, so
    /// the one-at-a-time fallback meets it after the datagrams of its batch: it ended the batch
    /// there and dropped the error, which no read then reported and `udp::drain_by` never
    /// counted (`socket_errors`). It is reported by the next read, as one of its own.
    #[test]
    fn a_socket_error_the_fallback_meets_after_datagrams_is_reported_by_the_next_read() {
        let from: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        // What the socket gives, call by call: two datagrams, the error, then nothing.
        let mut queue: std::collections::VecDeque<Result<&[u8], io::ErrorKind>> = [
            Ok(&b"one"[..]),
            Ok(b"two"),
            Err(io::ErrorKind::ConnectionRefused),
        ]
        .into();
        let mut recv = |buf: &mut [u8]| match queue.pop_front() {
            Some(Ok(d)) => {
                buf[..d.len()].copy_from_slice(d);
                Ok((d.len(), from))
            }
            Some(Err(kind)) => Err(io::Error::from(kind)),
            None => Err(io::Error::from(io::ErrorKind::WouldBlock)),
        };
        let mut reader = BatchReader::new();
        // As `read_by` keeps the count the datagrams are borrowed by.
        reader.n = reader.read_each_by(BATCH, &mut recv).unwrap();
        assert_eq!(reader.n, 2);
        let got: Vec<&[u8]> = reader.datagrams().iter().map(|d| d.1).collect();
        assert_eq!(got, [&b"one"[..], b"two"]);
        let e = reader.read_each_by(BATCH, &mut recv).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        let e = reader.read_each_by(BATCH, &mut recv).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    /// A pending socket error (here ECONNREFUSED, from the ICMP port unreachable a probe got)
    /// is reported by a read of its own, ahead of the datagrams queued behind it, and cleared
    /// by it: the next read takes them, in `recvmmsg` and in the one-at-a-time fallback alike.
    /// The receive loop reads on past it (`udp::drain_by`, review, session 34).
    #[tokio::test]
    async fn a_pending_socket_error_comes_alone_and_the_datagrams_behind_it_next() {
        for each in [false, true] {
            let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let peer_addr = closed.local_addr().unwrap();
            drop(closed);
            // Linux reports ICMP errors on a UDP socket only once it is connected.
            let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            rx.connect(peer_addr).await.unwrap();
            rx.send(b"probe").await.unwrap();
            let ready = rx.ready(tokio::io::Interest::ERROR);
            let waited = tokio::time::timeout(std::time::Duration::from_secs(10), ready).await;
            waited.expect("the ICMP error never came").unwrap();
            let peer = std::net::UdpSocket::bind(peer_addr).unwrap();
            for i in 0..3u8 {
                peer.send_to(&[i], rx.local_addr().unwrap()).unwrap();
            }
            rx.readable().await.unwrap();
            let mut reader = BatchReader::new();
            let how = if each {
                BatchReader::read_each
            } else {
                BatchReader::read_now
            };
            let e = reader.read_by(&rx, BATCH, how).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "each {each}");
            assert_eq!(reader.read_by(&rx, BATCH, how).unwrap(), 3, "each {each}");
            let got: Vec<Vec<u8>> = reader.datagrams().iter().map(|d| d.1.to_vec()).collect();
            assert_eq!(got, [[0], [1], [2]], "each {each}");
        }
    }
}
