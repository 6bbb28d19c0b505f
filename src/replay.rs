//! `pvp-t140 replay`: drives the core from a capture, using the capture's own timestamps as the
//! clock, so idle flushes and stream timeouts happen exactly as they would have on the wire.

use std::io::{self, Write};
use std::path::Path;

use crate::capture::{self, CaptureError, CaptureStats, Frame, ReplayClock};
use crate::gateway::{Config, Gateway, Stats};
use crate::presence::Presence;
use crate::time::Time;

#[derive(Debug)]
pub struct ReplaySummary {
    pub capture: CaptureStats,
    pub stats: Stats,
}

/// The RTCP port a live gateway listening on `port` also reads, by default (RFC 3550 11: the
/// next one up; none for 0 or 65535). Must match `run_live` in main.rs.
fn rtcp_port(port: u16) -> Option<u16> {
    match port {
        0 | u16::MAX => None,
        p => Some(p + 1),
    }
}

/// Replays the UDP datagrams of `path` through a gateway and writes every envelope as one JSON
/// line (pvp-spec 19.4) to `out`. With `port`, only datagrams to that port and to the RTCP port
/// after it (none after 0 or 65535): what a live gateway on that port reads by default, so
/// both give the same envelopes. Every frame with a timestamp moves the clock, fed to the core
/// or not (other ports, other protocols), and the replay shuts down at the last one's time:
/// the idle flushes and stream timeouts due in the time the capture covers all happen.
pub fn run(
    path: &Path,
    cfg: Config,
    port: Option<u16>,
    out: &mut dyn Write,
) -> Result<ReplaySummary, CaptureError> {
    let mut gw = Gateway::new(cfg);
    let mut clock = ReplayClock::default();
    let mut write_err: Option<io::Error> = None;
    let mut presence = Presence::default();
    let capture = capture::read_frames(path, |frame| {
        if write_err.is_some() {
            return;
        }
        // Every frame's time moves the clock, as the wire's time passed whatever it carried:
        // the timers due by then fire before its datagram, if any, is handled.
        let at = clock.at(frame.time());
        match frame {
            Frame::Udp(d) if port.is_none_or(|p| d.destination.port() == p) => {
                gw.handle_datagram(at, d.source, &d.payload);
            }
            // As a live gateway on that port reads its RTCP port: RTCP only.
            Frame::Udp(d) if port.and_then(rtcp_port) == Some(d.destination.port()) => {
                gw.handle_rtcp_port(at, d.source, &d.payload, true);
            }
            _ => fire_due(&mut gw, at),
        }
        if let Err(e) = drain(&mut gw, &mut presence, out) {
            write_err = Some(e);
        }
    })?;
    if let Some(e) = write_err {
        return Err(CaptureError::Io(e));
    }
    gw.shutdown(clock.now());
    drain(&mut gw, &mut presence, out).map_err(CaptureError::Io)?;
    out.flush().map_err(CaptureError::Io)?;
    Ok(ReplaySummary {
        capture,
        stats: gw.stats(),
    })
}

/// Fires the timers due by `now`, each at its own time, as the core does before a datagram.
fn fire_due(gw: &mut Gateway, now: Time) {
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= now) {
        gw.handle_timeout(t);
    }
}

/// As a sink writes them: one join and one leave a participant id ([`Presence`]).
fn drain(gw: &mut Gateway, presence: &mut Presence, out: &mut dyn Write) -> io::Result<()> {
    while let Some(e) = gw.poll_output() {
        if !presence.admit(&e) {
            continue;
        }
        out.write_all(e.json().as_bytes())?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rtcp_port_is_the_next_one_up() {
        assert_eq!(rtcp_port(5004), Some(5005));
        assert_eq!(rtcp_port(0), None);
        assert_eq!(rtcp_port(u16::MAX), None);
    }
}
