//! The open-file limit. With `--server` every virtual participant holds a WebSocket of its own
//! (a PVP server binds a connection to one sender, pvp-spec 19.1), so a gateway with thousands
//! of streams needs thousands of descriptors. The common soft limit is 1,024 (systemd's default
//! for services and most login shells), which would turn the thousandth participant's connect
//! into "Too many open files" retries while its transcript waits and then drops. So at start
//! the soft limit is raised as far as `--max-streams` streams' participants need (up to 33 a
//! stream: a mixer's 32 sources and its own voice; the hard limit permitting), as network
//! servers commonly do, and a hard limit too low for one participant a stream is said once,
//! loudly.

use std::io;

/// Descriptors kept for everything besides the participants' connections and the receive
/// workers': stdio, the RTCP socket, the metrics listener and its clients (at most
/// [`crate::metrics::MAX_CONNECTIONS`]), the spool, the main runtime's own.
pub const RESERVED: u64 = 64;

/// Descriptors each receive worker holds (`--workers`), counted in /proc/self/fd: its
/// SO_REUSEPORT socket, and its runtime's two epoll instances, eventfd and signal socket. With
/// `--workers 64` that is some 320, which a fixed reserve left to the participants' share.
pub const PER_WORKER: u64 = 5;

/// Descriptors kept besides the participants' connections with `workers` receive workers.
pub fn reserved(workers: u64) -> u64 {
    RESERVED.saturating_add(PER_WORKER.saturating_mul(workers))
}

/// The soft limit before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub before: u64,
    pub now: u64,
    /// Descriptors kept besides the participants' ([`reserved`]).
    pub reserved: u64,
}

impl Limit {
    /// Participants that can hold a connection at the same time.
    pub fn participants(&self) -> u64 {
        self.now.saturating_sub(self.reserved)
    }
}

/// Participants `streams` streams can have at most: a stream is up to
/// [`crate::stream::MAX_SPEAKERS`] of them (an RFC 9071 mixer's sources, t140llm's named
/// streams) and its own voice, made past that bound for its CSRC-less packets
/// (`stream::new_speaker`), each a connection of its own. Raised for one a stream, two mixers
/// of 32 sources under `--max-streams 2` and a soft limit of 64 connected 55 of their 64
/// participants; the rest retried and dropped their transcripts (review u). Raised for 32 a
/// stream, a mixer speaking itself beside its 32 sources had a 33rd with no descriptor
/// (review aw).
pub fn participants_of(streams: u64) -> u64 {
    streams.saturating_mul(crate::stream::MAX_SPEAKERS as u64 + 1)
}

/// Raises the soft open-file limit to what the participants of `streams` streams
/// ([`participants_of`]) need besides `workers` receive workers ([`reserved`]), or to the hard
/// limit if that is lower. Never lowers it.
#[cfg(unix)]
pub fn raise(streams: u64, workers: u64) -> io::Result<Limit> {
    let (before, _) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let reserved = reserved(workers);
    let now = rlimit::increase_nofile_limit(participants_of(streams).saturating_add(reserved))?;
    Ok(Limit {
        before,
        now: now.max(before),
        reserved,
    })
}

/// No per-process open-file limit to raise here.
#[cfg(not(unix))]
pub fn raise(_streams: u64, _workers: u64) -> io::Result<Limit> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no open-file limit on this platform",
    ))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn raising_never_lowers_the_limit() {
        let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        // Asking for fewer than the process has must leave the limit where it is.
        let l = raise(0, 0).unwrap();
        assert_eq!(l.before, soft);
        assert!(l.now >= soft, "{l:?}");
        assert_eq!(
            rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap().0,
            l.now
        );
    }
}
