//! The queue from the receive workers to the sink. Each worker runs on a thread of its own
//! (`udp::spawn_worker`), so every hand-off that wakes the sink may cost a context switch; a
//! worker therefore hands over a whole batch of envelopes as one message, one wake-up, instead
//! of one message per envelope (which woke the sink at the first and let it take them one at a
//! time). The bound counts envelopes, not messages, whatever the batches' sizes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use crate::pvp::{Envelope, Kind};

/// A queue of at most `bound` envelopes (see `udp::SINK_QUEUE` for the one the gateway uses).
pub fn queue(bound: usize) -> (Sender, Receiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Sender {
            tx,
            queued: queued.clone(),
            bound,
        },
        Receiver { rx, queued },
    )
}

/// A worker's end; cloned for each worker.
#[derive(Debug, Clone)]
pub struct Sender {
    tx: mpsc::UnboundedSender<Vec<Envelope>>,
    /// Envelopes handed over and not yet taken by the sink.
    queued: Arc<AtomicUsize>,
    bound: usize,
}

impl Sender {
    /// Hands over as much of `batch`, in order, as there is room for, and its joins and leaves
    /// whatever the room. Returns how many envelopes were refused: the newest that are neither,
    /// for lack of room (or all, with the sink gone).
    ///
    /// A refused join would leave every later envelope of its participant without one, which a
    /// server refuses (pvp-spec 6.3): one envelope lost would lose the speaker's transcript. A
    /// refused leave would keep the participant in the session for good. They are two a
    /// participant, so what they add to the queue is bounded by the streams.
    pub fn offer(&self, mut batch: Vec<Envelope>) -> usize {
        let n = batch.len();
        // Claim room first, give back what does not fit: concurrent workers never together
        // exceed the bound (save by membership envelopes).
        let before = self.queued.fetch_add(n, Ordering::AcqRel);
        let room = self.bound.saturating_sub(before).min(n);
        if room < n {
            let mut at = 0;
            batch.retain(|e| {
                at += 1;
                at <= room || matches!(e.kind(), Kind::SessionJoin | Kind::SessionLeave)
            });
            self.queued.fetch_sub(n - batch.len(), Ordering::AcqRel);
        }
        (n - batch.len()) + self.deliver(batch)
    }

    /// Hands over all of `batch` whatever the bound, for the final flushes and leaves at
    /// shutdown: SIGTERM must not lose text. They already sit in memory, in the core's output
    /// (`Gateway::shutdown` makes them all at once, a few per live stream), and move here
    /// without a copy. Returns how many were lost because the sink is gone.
    pub fn force(&self, batch: Vec<Envelope>) -> usize {
        self.queued.fetch_add(batch.len(), Ordering::AcqRel);
        self.deliver(batch)
    }

    /// Sends `batch`, whose room is claimed; with the sink gone, gives the room back and
    /// returns how many were lost.
    fn deliver(&self, batch: Vec<Envelope>) -> usize {
        let n = batch.len();
        if n == 0 || self.tx.send(batch).is_ok() {
            return 0;
        }
        self.queued.fetch_sub(n, Ordering::AcqRel);
        n
    }
}

/// The sink's end.
#[derive(Debug)]
pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Vec<Envelope>>,
    queued: Arc<AtomicUsize>,
}

impl Receiver {
    /// The next envelopes, with whatever else is already waiting appended (up to `most`
    /// envelopes in all, one batch always whole), oldest first; `None` once every sender is
    /// gone and the queue is empty.
    pub async fn recv(&mut self, most: usize) -> Option<Vec<Envelope>> {
        let first = self.rx.recv().await?;
        Some(self.gather(first, most))
    }

    /// [`Receiver::recv`] for a plain thread (the stdout writer), which waits without a
    /// runtime. Must not be called from async code.
    pub fn blocking_recv(&mut self, most: usize) -> Option<Vec<Envelope>> {
        let first = self.rx.blocking_recv()?;
        Some(self.gather(first, most))
    }

    /// [`Receiver::recv`] without waiting: `None` when nothing is queued.
    pub fn try_recv(&mut self, most: usize) -> Option<Vec<Envelope>> {
        let first = self.rx.try_recv().ok()?;
        Some(self.gather(first, most))
    }

    fn gather(&mut self, mut batch: Vec<Envelope>, most: usize) -> Vec<Envelope> {
        while batch.len() < most {
            match self.rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        self.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        batch
    }

    /// Envelopes waiting.
    pub fn depth(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// [`Receiver::depth`]'s counter, to read after the receiver has moved (the stdout writer's
    /// thread owns it).
    pub fn queued(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pvp::{Builder, Kind, SenderId};
    use crate::time::Time;

    fn envelopes(n: usize) -> Vec<Envelope> {
        numbered(0, n)
    }

    /// `n` envelopes whose payloads count up from `from` (`{"i": from}`, ...).
    pub(crate) fn numbered(from: usize, n: usize) -> Vec<Envelope> {
        let mut b = Builder::new("s".into(), None, 1);
        (from..from + n)
            .map(|i| {
                b.envelope(
                    Time::from_millis(i as u64),
                    SenderId::from(format!("p{i}")),
                    Kind::ContextAdd,
                    &serde_json::json!({ "i": i }),
                )
            })
            .collect()
    }

    fn ids(batch: &[Envelope]) -> Vec<String> {
        batch.iter().map(|e| e.id().to_string()).collect()
    }

    #[tokio::test]
    async fn the_bound_counts_envelopes_and_refuses_the_newest() {
        let (tx, mut rx) = queue(5);
        assert_eq!(tx.offer(envelopes(3)), 0);
        let more = envelopes(4);
        let expect_kept = ids(&more[..2]);
        assert_eq!(tx.offer(more), 2, "room for 2 of 4");
        assert_eq!(rx.depth(), 5);
        assert_eq!(tx.offer(envelopes(1)), 1, "full");
        let got = rx.recv(usize::MAX).await.unwrap();
        assert_eq!(got.len(), 5, "both waiting batches in one");
        assert_eq!(ids(&got[3..]), expect_kept);
        assert_eq!(rx.depth(), 0);
        assert_eq!(tx.offer(envelopes(5)), 0, "room again");
        assert_eq!(rx.recv(1).await.unwrap().len(), 5, "a batch is never split");
    }

    /// Joins and leaves pass a full queue, the rest of their batch is refused as before: a
    /// refused join would leave its participant's later envelopes without one.
    #[tokio::test]
    async fn joins_and_leaves_pass_a_full_queue() {
        let (tx, mut rx) = queue(2);
        assert_eq!(tx.offer(envelopes(2)), 0);
        let mut b = Builder::new("s".into(), None, 2);
        let mut env = |kind| b.envelope(Time(0), SenderId::from("q"), kind, &serde_json::json!({}));
        let batch = vec![
            env(Kind::SessionJoin),
            env(Kind::ContextAdd),
            env(Kind::SessionLeave),
        ];
        let want = vec![batch[0].id(), batch[2].id()];
        assert_eq!(tx.offer(batch), 1, "only the context.add");
        assert_eq!(rx.depth(), 4);
        let got = rx.recv(usize::MAX).await.unwrap();
        assert_eq!(got[2..].iter().map(Envelope::id).collect::<Vec<_>>(), want);
        assert_eq!(rx.depth(), 0);
    }

    #[tokio::test]
    async fn force_ignores_the_bound_and_everything_arrives_in_order() {
        let (tx, mut rx) = queue(2);
        let a = envelopes(2);
        let b = envelopes(3);
        let want: Vec<String> = ids(&a).into_iter().chain(ids(&b)).collect();
        assert_eq!(tx.offer(a), 0);
        assert_eq!(tx.force(b), 0);
        assert_eq!(rx.depth(), 5);
        drop(tx);
        let mut got = Vec::new();
        while let Some(batch) = rx.recv(1).await {
            got.extend(ids(&batch));
        }
        assert_eq!(got, want);
    }

    #[test]
    fn with_the_sink_gone_everything_is_refused_and_nothing_stays_counted() {
        let (tx, rx) = queue(10);
        drop(rx);
        assert_eq!(tx.offer(envelopes(3)), 3);
        assert_eq!(tx.force(envelopes(2)), 2);
        assert_eq!(tx.queued.load(Ordering::Acquire), 0);
    }
}
