//! The live receive loop: a UDP socket drives the core, the core's envelopes go to a sink.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::UdpSocket;

use crate::clock::Clock;
use crate::gateway::Gateway;
use crate::sink::Sink;

/// Datagrams handled per wake-up before timers and output get a turn, so a flood on the socket
/// cannot starve idle flushes.
const RECV_BUDGET: usize = 1024;

/// Runs until `shutdown` resolves, then flushes every stream, sends their leaves, and returns.
pub async fn run(
    socket: &UdpSocket,
    rtcp: Option<&UdpSocket>,
    gw: &mut Gateway,
    sink: &mut Sink,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let clock = Clock::new();
    // One buffer for the life of the loop: the core borrows each datagram from it.
    let mut buf = vec![0u8; 65_536];
    tokio::pin!(shutdown);
    loop {
        let deadline = gw.poll_timeout().map(|t| clock.instant_of(t));
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            r = socket.readable() => {
                r?;
                drain_socket(socket, gw, &mut buf, &clock);
            }
            r = readable(rtcp) => {
                r?;
                if let Some(rtcp) = rtcp {
                    drain_socket(rtcp, gw, &mut buf, &clock);
                }
            }
            () = sleep_until(deadline) => gw.handle_timeout(clock.now()),
        }
        while let Some(e) = gw.poll_output() {
            sink.send(e);
        }
    }
    gw.shutdown(clock.now());
    while let Some(e) = gw.poll_output() {
        sink.send(e);
    }
    Ok(())
}

/// Feeds the core what the socket has ready, up to the budget, borrowing each datagram from one
/// buffer: no allocation per packet here.
fn drain_socket(socket: &UdpSocket, gw: &mut Gateway, buf: &mut [u8], clock: &Clock) {
    for _ in 0..RECV_BUDGET {
        match socket.try_recv_from(buf) {
            Ok((n, src)) => gw.handle_datagram(clock.now(), src, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // ICMP errors surface here on some platforms; they are not fatal.
            Err(e) => {
                tracing::debug!("recv_from: {e}");
                break;
            }
        }
    }
}

async fn readable(socket: Option<&UdpSocket>) -> io::Result<()> {
    match socket {
        Some(s) => s.readable().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Binds the listening socket with a large receive buffer, so bursts wait in the kernel rather
/// than being dropped there.
pub fn bind(addr: std::net::SocketAddr) -> io::Result<UdpSocket> {
    let std = std::net::UdpSocket::bind(addr)?;
    std.set_nonblocking(true)?;
    let socket = UdpSocket::from_std(std)?;
    Ok(socket)
}

/// Grace period for sinks to deliver the final flushes and leaves on shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// `pvp-t140 send`: reads text from `input` and sends it as T.140 over RTP to `to`, paced by
/// the sans-IO [`crate::send::Sender`]; on end of input, waits for the redundancy to drain and
/// sends an RTCP BYE (rtcp-mux, RFC 5761) so the receiver ends the stream at once.
pub async fn send_text(
    to: std::net::SocketAddr,
    cfg: crate::send::SenderConfig,
    mut input: impl tokio::io::AsyncRead + Unpin,
    bye: bool,
) -> io::Result<crate::send::SenderStats> {
    use tokio::io::AsyncReadExt;
    let bind: std::net::SocketAddr = if to.is_ipv6() {
        "[::]:0".parse()
    } else {
        "0.0.0.0:0".parse()
    }
    .expect("literal");
    let socket = UdpSocket::bind(bind).await?;
    let clock = Clock::new();
    let ssrc = cfg.ssrc;
    let mut sender = crate::send::Sender::new(cfg, clock.now());
    let mut buf = vec![0u8; 4096];
    // Bytes of a UTF-8 character split across reads.
    let mut carry: Vec<u8> = Vec::new();
    let mut eof = false;
    loop {
        while let Some(pkt) = sender.poll_packet(clock.now()) {
            socket.send_to(&pkt, to).await?;
        }
        if eof && sender.is_idle() {
            break;
        }
        let deadline = sender.poll_timeout().map(|t| clock.instant_of(t));
        tokio::select! {
            n = input.read(&mut buf), if !eof => {
                let n = n?;
                if n == 0 {
                    eof = true;
                    if !carry.is_empty() {
                        sender.push_text(clock.now(), &String::from_utf8_lossy(&carry));
                        carry.clear();
                    }
                    continue;
                }
                carry.extend_from_slice(&buf[..n]);
                let valid = match std::str::from_utf8(&carry) {
                    Ok(s) => s.len(),
                    Err(e) if e.error_len().is_none() => e.valid_up_to(),
                    Err(_) => carry.len(),
                };
                // T.140's new line is U+2028 (LINE SEPARATOR); terminals and pipes give LF.
                let text = String::from_utf8_lossy(&carry[..valid]).replace("\r\n", "\n").replace('\n', "\u{2028}");
                carry.drain(..valid);
                sender.push_text(clock.now(), &text);
            }
            () = sleep_until(deadline) => {}
        }
    }
    if bye {
        let mut pkt = Vec::new();
        crate::rtcp::write_bye(&mut pkt, ssrc);
        socket.send_to(&pkt, to).await?;
    }
    Ok(sender.stats())
}
