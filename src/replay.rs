//! `pvp-t140 replay`: drives the core from a capture, using the capture's own timestamps as the
//! clock, so idle flushes and stream timeouts happen exactly as they would have on the wire.

use std::io::{self, Write};
use std::path::Path;

use crate::capture::{self, CaptureError, CaptureStats};
use crate::gateway::{Config, Gateway, Stats};
use crate::time::Time;

#[derive(Debug)]
pub struct ReplaySummary {
    pub capture: CaptureStats,
    pub stats: Stats,
}

/// Replays the UDP datagrams of `path` (only those to `port`, when given) through a gateway and
/// writes every envelope as one JSON line (pvp-spec 19.4) to `out`.
pub fn run(
    path: &Path,
    cfg: Config,
    port: Option<u16>,
    out: &mut dyn Write,
) -> Result<ReplaySummary, CaptureError> {
    let mut gw = Gateway::new(cfg);
    let mut last = Time(0);
    let mut write_err: Option<io::Error> = None;
    let capture = capture::read_udp(path, |d| {
        if write_err.is_some() || port.is_some_and(|p| d.destination.port() != p) {
            return;
        }
        // Captures can step back in time (multi-interface pcapng); the core's clock must not.
        last = last.max(d.time);
        gw.handle_datagram(last, d.source, &d.payload);
        if let Err(e) = drain(&mut gw, out) {
            write_err = Some(e);
        }
    })?;
    if let Some(e) = write_err {
        return Err(CaptureError::Io(e));
    }
    gw.shutdown(last);
    drain(&mut gw, out).map_err(CaptureError::Io)?;
    out.flush().map_err(CaptureError::Io)?;
    Ok(ReplaySummary {
        capture,
        stats: gw.stats(),
    })
}

fn drain(gw: &mut Gateway, out: &mut dyn Write) -> io::Result<()> {
    while let Some(e) = gw.poll_output() {
        out.write_all(e.json().as_bytes())?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
