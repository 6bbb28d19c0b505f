//! Where envelopes go: stdout (pvp-spec 19.4 stdio binding) or a PVP server over WebSocket
//! (19.1). Sinks never block the caller: the UDP loop hands an envelope over and moves on.

pub mod gate;
pub mod spool;
pub mod stdout;
pub mod tls;
pub mod ws;

use std::time::Duration;

use crate::pvp::Envelope;

/// Counters every sink keeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SinkStats {
    pub sent: u64,
    /// Envelopes refused because the sink's bounded queue was full or the sink had failed.
    pub dropped: u64,
}

pub enum Sink {
    Stdout(stdout::StdoutSink),
    Ws(ws::WsSink),
}

impl Sink {
    /// Several envelopes at once, in order (one hand-off to the stdout writer).
    pub fn send_batch(&mut self, batch: Vec<Envelope>) {
        match self {
            Sink::Stdout(s) => s.send_batch(batch),
            Sink::Ws(s) => batch.into_iter().for_each(|e| s.send(e)),
        }
    }

    /// Delivers what is queued (waiting at most `grace`) and closes.
    pub async fn close(self, grace: Duration) -> SinkStats {
        match self {
            Sink::Stdout(s) => s.close(grace).await,
            Sink::Ws(s) => s.close(grace).await,
        }
    }
}
