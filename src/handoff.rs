//! The queue from the receive workers to the sink. Each worker runs on a thread of its own
//! (`udp::spawn_worker`), so every hand-off that wakes the sink may cost a context switch; a
//! worker therefore hands over a whole batch of envelopes as one message, one wake-up, instead
//! of one message per envelope (which woke the sink at the first and let it take them one at a
//! time). The bound counts envelopes, not messages, whatever the batches' sizes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use crate::pvp::{Envelope, Kind, SenderId};
use crate::refused::RefusedItems;
use crate::said::Said;

/// A queue of at most `bound` envelopes (see `udp::SINK_QUEUE` for the one the gateway uses).
pub fn queue(bound: usize) -> (Sender, Receiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Sender {
            tx,
            queued: queued.clone(),
            bound,
            held: VecDeque::new(),
            held_ids: Counts::default(),
            refused: RefusedItems::new(bound),
            refused_total: Counter::default(),
            said: Said::default(),
        },
        Receiver { rx, queued },
    )
}

/// A worker's end; cloned for each worker. What it remembers of refusals (below) is its own
/// (a clone starts with none): a speaker's envelopes all come from one worker.
#[derive(Debug)]
pub struct Sender {
    tx: mpsc::UnboundedSender<Vec<Envelope>>,
    /// Envelopes handed over and not yet taken by the sink.
    queued: Arc<AtomicUsize>,
    bound: usize,
    /// Joins that found no room, oldest first, waiting for it: handed over before anything
    /// newer, or given up with their leave (at most one a live speaker).
    held: VecDeque<Envelope>,
    /// The participant ids of `held`, to find a waiting speaker's envelopes.
    held_ids: Counts,
    /// Items refused for lack of room, whose corrections are refused too (pvp-spec 9.3).
    refused: RefusedItems,
    /// Every refusal, shared by the clones ([`Sender::count_refusals`]).
    refused_total: Counter,
    /// This sender's refusals, logged at the first and then at most every 10 s: behind a
    /// stdout nobody reads every envelope is refused, and the log said nothing of it until
    /// the stop (review ba).
    said: Said<std::time::Instant>,
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        Sender {
            tx: self.tx.clone(),
            queued: self.queued.clone(),
            bound: self.bound,
            held: VecDeque::new(),
            held_ids: Counts::default(),
            refused: RefusedItems::new(self.bound),
            refused_total: self.refused_total.clone(),
            said: Said::default(),
        }
    }
}

impl Sender {
    /// Hands over as much of `batch`, in order, as there is room for, and its leaves whatever
    /// the room. Returns how many envelopes were refused: the newest, for lack of room (or
    /// all, with the sink gone).
    ///
    /// A participant's join must come before anything else it sends (pvp-spec 6.3), and its
    /// leave must follow: a refused leave would keep it in the session for good. A join that
    /// finds no room waits here (its speaker's later envelopes are refused meanwhile) and goes
    /// first when there is room; if its leave comes first, both are given up, so behind a
    /// stuck sink streams that come and go add nothing (the queue's excess is a leave a live
    /// speaker whose join went in, and joins held here are one a live speaker). An item
    /// refused takes its later corrections with it (`crate::refused`).
    pub fn offer(&mut self, batch: Vec<Envelope>) -> usize {
        let refused = self.hand_over(batch);
        self.count(refused)
    }

    /// Counts `refused` envelopes on `/metrics` ([`Sender::count_refusals`]), and logs them at
    /// the first and then at most every [`crate::said::SAID_EVERY`], with how many since.
    fn count(&mut self, refused: usize) -> usize {
        if refused > 0 {
            self.refused_total.inc_by(refused as u64);
            if let Some(refused) = self.said.tell(std::time::Instant::now(), refused as u64) {
                tracing::warn!(
                    refused,
                    "sink queue full: envelopes refused, the sink not keeping up (a stdout not \
                     read, a slow PVP server); logged at most every 10 s, with how many since, \
                     each counted (sink_queue_full)"
                );
            }
        }
        refused
    }

    /// Refusals (by [`Sender::offer`] and [`Sender::force`], of this sender and its clones)
    /// are counted in `total` as they happen, so `/metrics` shows a sink falling behind while
    /// it does, not only in the log at exit.
    pub fn count_refusals(&mut self, total: Counter) {
        self.refused_total = total;
    }

    /// [`Sender::offer`], uncounted.
    fn hand_over(&mut self, mut batch: Vec<Envelope>) -> usize {
        // Claim room first (for the joins waiting too), give back what does not go: concurrent
        // workers never together exceed the bound (save by leaves, which the claim covers).
        let n = batch.len() + self.held.len();
        let before = self.queued.fetch_add(n, Ordering::AcqRel);
        let mut room = self.bound.saturating_sub(before).min(n);
        if room == n && self.held.is_empty() && self.refused.is_empty() {
            return self.deliver(batch);
        }
        // Held joins first: they are older than anything in the batch.
        let mut out = Vec::new();
        while room > 0
            && let Some(join) = self.held.pop_front()
        {
            self.held_ids.take(join.sender());
            out.push(join);
            room -= 1;
        }
        let mut refused = 0;
        for e in batch.drain(..) {
            // One id may speak in two sessions (a rule's participant in two rooms): a
            // participant is its id in its session, as for `Presence`.
            let waiting = !self.held.is_empty()
                && self.held_ids.contains(e.sender())
                && self.held.iter().any(|j| same_participant(j, &e));
            // A new name (pvp-spec 7.1) for a speaker whose own join waits: the join carries
            // it. Another speaker's waiting join under the same id (a mapping rule's) is not
            // this speaker's: renamed after it, the name was lost uncounted (review ba).
            let renames = (waiting && e.kind() == Kind::ParticipantAnnounce)
                .then(|| {
                    let speaker = crate::presence::speaker_of(&e);
                    self.held.iter().rposition(|j| {
                        same_participant(j, &e) && crate::presence::speaker_of(j) == speaker
                    })
                })
                .flatten();
            if let Some(i) = renames {
                self.held[i] = self.held[i].join_as_announced(&e);
                continue;
            }
            match e.kind() {
                Kind::SessionLeave if waiting => {
                    // Never joined, as far as the sink knows: nothing of it went in.
                    self.held_ids.take(e.sender());
                    if let Some(i) = self.held.iter().rposition(|j| same_participant(j, &e)) {
                        self.held.remove(i);
                    }
                    refused += 2;
                }
                Kind::SessionLeave => {
                    // Past the bound if need be.
                    room = room.saturating_sub(1);
                    out.push(e);
                }
                Kind::SessionJoin if room == 0 => {
                    self.held_ids.add(e.sender());
                    self.held.push_back(e);
                }
                _ if waiting || room == 0 || self.refused.corrects(&e) => {
                    self.refused.refused(&e);
                    refused += 1;
                }
                _ => {
                    room -= 1;
                    out.push(e);
                }
            }
        }
        // What was claimed and does not go, goes back.
        self.queued.fetch_sub(n - out.len(), Ordering::AcqRel);
        refused + self.deliver(out)
    }

    /// Hands over all of `batch` whatever the bound, for the final flushes and leaves at
    /// shutdown: SIGTERM must not lose text. They already sit in memory, in the core's output
    /// (`Gateway::shutdown` makes them all at once, a few per live stream), and move here
    /// without a copy, after the joins still waiting for room. Returns how many were lost
    /// because the sink is gone, or refused as corrections of refused items.
    pub fn force(&mut self, mut batch: Vec<Envelope>) -> usize {
        let before = batch.len();
        if !self.refused.is_empty() {
            batch.retain(|e| !self.refused.corrects(e));
        }
        let refused = before - batch.len();
        if !self.held.is_empty() {
            self.held_ids = Counts::default();
            batch.splice(0..0, self.held.drain(..));
        }
        self.queued.fetch_add(batch.len(), Ordering::AcqRel);
        let lost = refused + self.deliver(batch);
        self.count(lost)
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

fn same_participant(a: &Envelope, b: &Envelope) -> bool {
    a.sender() == b.sender() && a.session_json() == b.session_json()
}

/// How many of [`Sender::held`]'s joins each participant id has (two speakers a mapping rule
/// names alike share one), whatever their sessions: a quick look before the queue's.
#[derive(Debug, Default)]
struct Counts(HashMap<SenderId, usize>);

impl Counts {
    fn add(&mut self, id: &SenderId) {
        *self.0.entry(id.clone()).or_default() += 1;
    }

    fn take(&mut self, id: &SenderId) {
        if let Some(n) = self.0.get_mut(id.as_str()) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(id.as_str());
            }
        }
    }

    fn contains(&self, id: &SenderId) -> bool {
        self.0.contains_key(id.as_str())
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
        let (mut tx, mut rx) = queue(5);
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

    /// A leave passes a full queue; a join waits for room, and the participant's envelopes
    /// behind it are refused meanwhile; with room, the join goes first. A leave that comes
    /// while its join waits takes the join with it: the sink saw neither.
    #[tokio::test]
    async fn a_join_waits_for_room_and_a_leave_passes_a_full_queue() {
        let (mut tx, mut rx) = queue(2);
        assert_eq!(tx.offer(envelopes(2)), 0);
        let mut b = Builder::new("s".into(), None, 2);
        let mut env = |who: &str, kind| {
            b.envelope(Time(0), SenderId::from(who), kind, &serde_json::json!({}))
        };
        // p0 is in (its join went in before); q joins while the queue is full.
        let batch = vec![
            env("q", Kind::SessionJoin),
            env("q", Kind::ContextAdd),
            env("p0", Kind::SessionLeave),
        ];
        let (join_q, leave_p0) = (batch[0].id(), batch[2].id());
        assert_eq!(tx.offer(batch), 1, "q's context.add; its join waits");
        assert_eq!(rx.depth(), 3, "p0's leave past the bound");
        let got = rx.recv(usize::MAX).await.unwrap();
        assert_eq!(got[2].id(), leave_p0);
        // Room again: q's join first, then what q says now.
        let add = env("q", Kind::ContextAdd);
        let add_id = add.id();
        assert_eq!(tx.offer(vec![add]), 0);
        let got = rx.recv(usize::MAX).await.unwrap();
        assert_eq!(
            got.iter().map(Envelope::id).collect::<Vec<_>>(),
            [join_q, add_id]
        );
        // Full again: r joins, says something and leaves while full. None of it goes in.
        assert_eq!(tx.offer(envelopes(2)), 0);
        let batch = vec![
            env("r", Kind::SessionJoin),
            env("r", Kind::ContextAdd),
            env("r", Kind::SessionLeave),
        ];
        assert_eq!(tx.offer(batch), 3);
        assert_eq!(rx.depth(), 2);
        assert!(tx.held.is_empty() && tx.held_ids.0.is_empty());
    }

    /// A name learnt while the join waits (pvp-spec 7.1) goes in with the join.
    #[tokio::test]
    async fn an_announce_behind_a_waiting_join_renames_it() {
        let (mut tx, mut rx) = queue(1);
        assert_eq!(tx.offer(envelopes(1)), 0);
        let mut b = Builder::new("s".into(), None, 2);
        let who = |name: &str| serde_json::json!({"participant": {"id": "q", "name": name}});
        let join = b.envelope(Time(0), SenderId::from("q"), Kind::SessionJoin, &who("old"));
        let announce = b.envelope(
            Time(0),
            SenderId::from("q"),
            Kind::ParticipantAnnounce,
            &serde_json::json!({"id": "q", "name": "Ada"}),
        );
        assert_eq!(tx.offer(vec![join, announce]), 0);
        rx.recv(usize::MAX).await.unwrap();
        assert_eq!(tx.offer(Vec::new()), 0);
        let got = rx.recv(usize::MAX).await.unwrap();
        assert_eq!(got.len(), 1);
        let m = got[0].to_message();
        assert_eq!(
            (m.kind.as_str(), m.payload["participant"]["name"].as_str()),
            ("session.join", Some("Ada"))
        );
    }

    /// pvp-spec 9.3: a correction names an existing item; one of an item refused for lack of
    /// room is refused too, by `offer` and by `force`.
    #[tokio::test]
    async fn corrections_of_an_item_refused_for_lack_of_room_are_refused() {
        let (mut tx, mut rx) = queue(1);
        assert_eq!(tx.offer(envelopes(1)), 0);
        let mut b = Builder::new("s".into(), None, 2);
        let mut env = |kind, key: &str| {
            b.envelope(
                Time(0),
                SenderId::from("q"),
                kind,
                &serde_json::json!({ "key": key }),
            )
        };
        assert_eq!(tx.offer(vec![env(Kind::ContextAdd, "k1")]), 1);
        rx.recv(usize::MAX).await.unwrap();
        let other = env(Kind::ContextUpdate, "k0");
        let other_id = other.id();
        assert_eq!(tx.offer(vec![env(Kind::ContextUpdate, "k1"), other]), 1);
        assert_eq!(rx.recv(usize::MAX).await.unwrap()[0].id(), other_id);
        assert_eq!(tx.force(vec![env(Kind::ContextRemove, "k1")]), 1);
        assert_eq!(rx.depth(), 0);
    }

    #[tokio::test]
    async fn force_ignores_the_bound_and_everything_arrives_in_order() {
        let (mut tx, mut rx) = queue(2);
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
        let (mut tx, rx) = queue(10);
        drop(rx);
        assert_eq!(tx.offer(envelopes(3)), 3);
        assert_eq!(tx.force(envelopes(2)), 2);
        assert_eq!(tx.queued.load(Ordering::Acquire), 0);
    }

    /// Refusals show on `/metrics` as they happen, a worker's clone's too (review, session 38:
    /// they were only in the log at exit).
    #[test]
    fn refusals_are_counted_where_metrics_read_them() {
        let total = Counter::default();
        let (mut tx, rx) = queue(2);
        tx.count_refusals(total.clone());
        let mut other = tx.clone();
        assert_eq!(tx.offer(envelopes(3)), 1);
        assert_eq!(total.get(), 1);
        assert_eq!(other.offer(envelopes(2)), 2);
        assert_eq!(total.get(), 3);
        drop(rx);
        assert_eq!(tx.force(envelopes(2)), 2);
        assert_eq!(total.get(), 5);
    }
}
