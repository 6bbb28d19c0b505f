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
