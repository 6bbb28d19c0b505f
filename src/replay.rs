//! `pvp-t140 replay`: drives the core from a capture, using the capture's own timestamps as the
//! clock, so idle flushes and stream timeouts happen exactly as they would have on the wire.

use std::io::{self, Write};
use std::ops::ControlFlow;
use std::path::Path;

use crate::admission::Admission;
use crate::capture::{self, CaptureError, CaptureStats, Frame, ReplayClock};
use crate::gateway::{Config, Gateway, Stats};
use crate::presence::Presence;
use crate::time::Time;

#[derive(Debug)]
pub struct ReplaySummary {
    pub capture: CaptureStats,
    pub stats: Stats,
    /// UDP datagrams `port` left out: to neither it nor the RTCP port read after it.
    pub other_ports: u64,
}

/// Why a replay failed.
#[derive(Debug)]
pub enum ReplayError {
    /// The capture could not be read.
    Capture(CaptureError),
    /// The envelopes could not be written (stdout for `pvp-t140 replay`: a full disk, a closed
    /// pipe): an error of the output, not of the capture, whose reading stops there.
    Output(io::Error),
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Capture(e) => write!(f, "{e}"),
            ReplayError::Output(e) => write!(f, "writing the envelopes: {e}"),
        }
    }
}

impl std::error::Error for ReplayError {}

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
/// both give the same envelopes. The datagrams fed to the core move the clock, and so do the
/// frames not fed (other ports, other protocols), steps back and all, each interface's by a
/// clock of its own (`Unfed`): the next datagram of their interface comes after them, and
/// the replay shuts down at the newest time after the last datagram, so the idle flushes and
/// stream timeouts due by then all happen.
pub fn run(
    path: &Path,
    cfg: Config,
    port: Option<u16>,
    out: &mut dyn Write,
) -> Result<ReplaySummary, ReplayError> {
    run_reading(path, cfg, port, true, out)
}

/// [`run`], the RTCP port after `port` fed only with `rtcp` (the live gateway's `--rtcp`: one
/// run with `rtcp = false` never read that port, and its replay must not either).
pub fn run_reading(
    path: &Path,
    cfg: Config,
    port: Option<u16>,
    rtcp: bool,
    out: &mut dyn Write,
) -> Result<ReplaySummary, ReplayError> {
    let read_rtcp_port = |p: u16| rtcp.then(|| rtcp_port(p)).flatten();
    // The RTCP port's own admission, as the live gateway's reader of it has.
    let mut rtcp_admission = Admission::new(cfg.allow.clone(), cfg.max_pps_per_source);
    let mut gw = Gateway::new(cfg);
    let mut clock = ReplayClock::default();
    let mut write_err: Option<io::Error> = None;
    let mut presence = Presence::default();
    let mut unfed = Unfed::new();
    let mut other_ports = 0;
    let read = capture::read_frames(path, |frame| {
        match frame {
            Frame::Udp(d, interface) if port.is_none_or(|p| d.destination.port() == p) => {
                unfed.feed(&mut clock, interface);
                gw.handle_datagram(clock.at(d.time), d.source, &d.payload);
            }
            // As a live gateway on that port reads its RTCP port: RTCP only.
            Frame::Udp(d, interface)
                if port.and_then(read_rtcp_port) == Some(d.destination.port()) =>
            {
                unfed.feed(&mut clock, interface);
                let at = clock.at(d.time);
                let refused = rtcp_admission.admit(at, d.source).err();
                gw.handle_rtcp_port(at, d.source, &d.payload, refused, true);
            }
            other => {
                if matches!(other, Frame::Udp(..)) {
                    other_ports += 1;
                }
                unfed.frame(&clock, other.interface(), other.time());
            }
        }
        // The first failed write ends the replay: nothing after it could be written.
        match drain(&mut gw, &mut presence, out) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                write_err = Some(e);
                ControlFlow::Break(())
            }
        }
    });
    if let Some(e) = write_err {
        return Err(ReplayError::Output(e));
    }
    // A capture refused part-way (a corrupt record after whole ones: Wireshark, too, shows
    // every record before it) still ends what the records before it began: their text held
    // for a flush and their leaves are written, then the capture's error is reported.
    let end = clock.now().max(unfed.newest);
    fire_due(&mut gw, end);
    gw.shutdown(end);
    let written = drain(&mut gw, &mut presence, out).and_then(|()| out.flush());
    let capture = read.map_err(ReplayError::Capture)?;
    written.map_err(ReplayError::Output)?;
    Ok(ReplaySummary {
        capture,
        stats: gw.stats(),
        other_ports,
    })
}

/// The clocks of the frames not fed to the core since the last fed datagram, one per capture
/// interface. Each starts as the replay's clock stood and moves on that interface's frames, as
/// the replay's clock would if they were fed, a step back included (README, Replaying
/// captures: every timestamped frame moves the clock, so that `--port` gives what a live
/// gateway on the port gave); the next fed datagram of the interface takes it over. One clock
/// for all interfaces would take their stamping apart (a minute, for a NIC stamping in
/// hardware) for steps, or for time passing, between datagrams of one.
struct Unfed {
    /// Per interface, the clock its frames moved since the last fed datagram.
    clocks: Vec<Option<ReplayClock>>,
    /// The newest time a clock reached since the last fed datagram.
    newest: Time,
}

impl Unfed {
    fn new() -> Self {
        Unfed {
            clocks: Vec::new(),
            newest: Time(0),
        }
    }

    /// A frame of `interface` captured at `captured` that is not fed moves its clock.
    fn frame(&mut self, clock: &ReplayClock, interface: usize, captured: Time) {
        if self.clocks.len() <= interface {
            self.clocks.resize(interface + 1, None);
        }
        let own = self.clocks[interface].get_or_insert(*clock);
        self.newest = self.newest.max(own.at(captured));
    }

    /// A datagram of `interface` is fed: `clock` takes over that interface's clock, if its
    /// frames moved one since the last fed datagram; every interface's starts anew.
    fn feed(&mut self, clock: &mut ReplayClock, interface: usize) {
        if let Some(Some(own)) = self.clocks.get(interface) {
            *clock = *own;
        }
        self.clocks.clear();
        self.newest = Time(0);
    }
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
