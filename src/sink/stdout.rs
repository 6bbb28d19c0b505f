//! NDJSON on stdout: one envelope a line (pvp-spec 19.4). A dedicated thread does the blocking
//! writes, so a slow reader of our stdout stalls that thread, not the UDP loop. Envelopes cross
//! to it in batches (what the receive loop produced per wake-up), so a busy gateway wakes the
//! writer once per batch, not once per envelope.

use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use super::SinkStats;
use crate::pvp::Envelope;

pub struct StdoutSink {
    tx: SyncSender<Vec<Envelope>>,
    thread: JoinHandle<()>,
    sent: Arc<AtomicU64>,
    dropped: u64,
}

impl StdoutSink {
    /// `capacity` batches may wait for the writer; beyond that the sender waits (see
    /// [`StdoutSink::send_batch`]).
    pub fn new(capacity: usize) -> Self {
        Self::with_writer(capacity, Box::new(std::io::stdout()))
    }

    pub fn with_writer(capacity: usize, out: Box<dyn Write + Send>) -> Self {
        let (tx, rx) = sync_channel(capacity);
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let thread = std::thread::Builder::new()
            .name("stdout-sink".into())
            .spawn(move || writer(rx, out, &counter))
            .expect("spawn stdout writer thread");
        StdoutSink {
            tx,
            thread,
            sent,
            dropped: 0,
        }
    }

    /// Hands envelopes to the writer thread. When stdout is not keeping up this waits (the
    /// sink task, not the UDP loop, waits; the bounded queue in front of the sink then decides,
    /// and counts, what is refused), so nothing is lost between here and stdout.
    pub fn send_batch(&mut self, batch: Vec<Envelope>) {
        if batch.is_empty() {
            return;
        }
        let batch = match self.tx.try_send(batch) {
            Ok(()) => return,
            Err(TrySendError::Full(b)) => b,
            Err(TrySendError::Disconnected(b)) => {
                self.dropped += b.len() as u64;
                tracing::error!(envelopes = b.len(), "stdout is closed; envelopes dropped");
                return;
            }
        };
        let n = batch.len() as u64;
        let tx = self.tx.clone();
        let send = move || tx.send(batch).is_ok();
        let sent = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(send)
            }
            _ => send(),
        };
        if !sent {
            self.dropped += n;
            tracing::error!(envelopes = n, "stdout is closed; envelopes dropped");
        }
    }

    pub async fn close(self, grace: Duration) -> SinkStats {
        drop(self.tx);
        let thread = self.thread;
        let joined = tokio::task::spawn_blocking(move || thread.join());
        if tokio::time::timeout(grace, joined).await.is_err() {
            tracing::warn!("stdout writer did not finish within {grace:?}");
        }
        SinkStats {
            sent: self.sent.load(Ordering::Relaxed),
            dropped: self.dropped,
        }
    }
}

fn writer(rx: Receiver<Vec<Envelope>>, out: Box<dyn Write + Send>, sent: &AtomicU64) {
    let mut out = BufWriter::with_capacity(64 << 10, out);
    while let Ok(mut batch) = rx.recv() {
        loop {
            for e in &batch {
                let written = out
                    .write_all(e.json().as_bytes())
                    .and_then(|()| out.write_all(b"\n"));
                if let Err(err) = written {
                    tracing::error!("writing to stdout failed: {err}");
                    return;
                }
            }
            sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
            match rx.try_recv() {
                Ok(next) => batch = next,
                Err(_) => break,
            }
        }
        // Flush once the queue is empty: batches under load, prompt lines when quiet.
        if let Err(err) = out.flush() {
            tracing::error!("writing to stdout failed: {err}");
            return;
        }
    }
}
