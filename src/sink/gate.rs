//! `--gate-transcripts` (pvp-implementation-guide STEP 4 `gateTranscripts`): each transcript
//! chunk is held back and offered for approval with a `gate.request` (pvp-spec 14.1,
//! `action_type: "context_change"`, `action_ref` = the id of the held `context.add`); it is sent
//! once `quorum` `gate.approve`s for that gate arrive (or the server's `gate.timeout` says
//! `auto_approved`), and dropped and counted on a `gate.reject`, a `gate.timeout` that rejects or
//! escalates, an `error` from the server naming the request ([`Gates::refuse`]; not its copy
//! written after a reconnect), or when no
//! answer comes within the timeout plus a grace period. Whatever the
//! participant sends after a held chunk (corrections, its leave) waits behind it, so order holds
//! and a correction of a rejected chunk is dropped with it. What is held counts against the
//! participant's queue bound: a chunk or correction offered when it is reached is dropped as a
//! rejected one. Of the participant's announces (its name) only the newest waits.
//!
//! Plain data in and out (time passed in), driven by the participant's connection task.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::pvp::{Builder, Envelope, Kind, Message};
use crate::refused::RefusedItems;
use crate::time::Time;

#[derive(Debug, Clone, Copy)]
pub struct GateConfig {
    /// `gate.approve`s needed (the request's quorum is `{type: "any", count}`).
    pub quorum: u32,
    /// `timeout_seconds` of the request.
    pub timeout: Duration,
}

/// After the request's own timeout, how long to wait for the server's `gate.timeout`.
const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug)]
enum Held {
    Gate {
        id: String,
        /// The `gate.request`, kept to offer again on a new connection: a server that lost the
        /// connection (or restarted) may have lost the gate with it.
        request: Envelope,
        add: Envelope,
        /// The held chunk's context key: its corrections are dropped with it.
        key: Option<String>,
        /// Who approved so far: the quorum counts participants (pvp-spec 14.2), so one
        /// approver approving twice (a re-offered request after a reconnect) counts once.
        approvers: Vec<String>,
        verdict: Option<Verdict>,
        deadline: Instant,
        /// The request was written again on a new connection ([`Gates::asked_again`]): a
        /// refusal of it may be a server's that still has the gate refusing the copy.
        copied: bool,
    },
    Plain(Envelope),
}

/// What an `error` naming a gate's request did to it ([`Gates::refuse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The chunk is refused, at the next [`Gates::release`].
    Refused,
    /// The request refused was a copy, written again after a reconnect: the chunk waits on for
    /// its gate's decision or its timeout.
    Copy,
    /// No undecided gate has that request.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approved,
    Rejected,
    TimedOut,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GateStats {
    pub requested: u64,
    pub approved: u64,
    pub rejected: u64,
    pub timed_out: u64,
}

/// Refused chunks a participant's gates remember ([`Gates::refused_keys`]).
const REFUSED_KEPT: usize = 64;

#[derive(Debug)]
pub struct Gates {
    cfg: GateConfig,
    held: VecDeque<Held>,
    /// What may be held at once: the participant's queue bound (README "Delivery to a PVP
    /// server"), which the held chunks would otherwise escape, a request each, for as long as
    /// no approver answers.
    room: usize,
    /// Keys of chunks that were not approved: their corrections are dropped too. A
    /// correction names its speaker's last item, so the newest few are enough.
    refused_keys: RefusedItems,
    pub stats: GateStats,
    /// Envelopes from the core dropped since [`Gates::take_gone`] last asked: chunks not
    /// approved and corrections of them. The connection counts them as settled, so that what
    /// is left unsettled at shutdown is what was lost.
    gone: u64,
    /// Of those, the corrections of refused chunks, by id: the connection marks them done in
    /// the spool (the refused chunks themselves it is handed by [`Gates::release`]), so that a
    /// restart does not resend a `context.update` for an item never added.
    dropped_corrections: Vec<ulid::Ulid>,
    /// Chunks (and corrections) offered with `room` already held, dropped unasked, by id: the
    /// connection counts them with the refused chunks and marks them done in the spool.
    crowded_out: Vec<ulid::Ulid>,
    /// Those drops, logged at the first and then at most every 10 s: a server that decides no
    /// gate crowds out every chunk its participant speaks, and a line each flooded the log.
    pub crowding: crate::said::Said<Instant>,
    /// `stats.approved` as [`Gates::take_approved`] last told it.
    approved_told: u64,
    /// Announces held behind a pending gate that a newer one replaced, by id: the connection
    /// marks them done in the spool (nothing is lost: the newer carries the name).
    superseded: Vec<ulid::Ulid>,
}

impl Gates {
    /// Gates holding at most `room` envelopes (see [`Gates::offer`]).
    pub fn new(cfg: GateConfig, room: usize) -> Self {
        Gates {
            cfg,
            held: VecDeque::new(),
            room,
            refused_keys: RefusedItems::new(REFUSED_KEPT),
            stats: GateStats::default(),
            gone: 0,
            dropped_corrections: Vec::new(),
            crowded_out: Vec::new(),
            crowding: crate::said::Said::default(),
            approved_told: 0,
            superseded: Vec::new(),
        }
    }

    /// An envelope from the core. Returns what to send now: a `gate.request` for a chunk, the
    /// envelope itself when nothing is held, else nothing (it waits its turn). A chunk or a
    /// correction offered with `room` envelopes held is dropped (a chunk's corrections with
    /// it, [`Gates::take_gone`], [`Gates::take_crowded_out`]) as a full queue drops text: its
    /// participant's queue bound bounds what waits for approval too. A correction of a refused
    /// chunk is dropped at once ([`Gates::take_dropped_corrections`]). An announce offered
    /// while an older one waits takes its place at the back ([`Gates::take_superseded`]).
    pub fn offer(
        &mut self,
        e: Envelope,
        pvp: &mut Builder,
        now: Instant,
        wall: Time,
    ) -> Option<Envelope> {
        // A correction of a chunk already refused goes at once, not behind the pending gates:
        // held there it would escape `room`, and with no done mark a restart would send it for
        // an item never added (pvp-spec 9.3).
        if self.refused_keys.corrects(&e) {
            return self.pass(e);
        }
        // Text is what a full queue drops; a correction held counts as much as a chunk.
        let text = e.kind().is_text();
        if text && self.held.len() >= self.room {
            self.refused_keys.refused(&e);
            self.gone += 1;
            self.crowded_out.push(e.id());
            return None;
        }
        if e.kind() == Kind::ContextAdd {
            let m = e.to_message();
            let preview: String = m.payload["content"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            let request = pvp.envelope(
                wall,
                e.sender().clone(),
                Kind::GateRequest,
                &json!({
                    "action_type": "context_change",
                    "action_ref": m.id,
                    "quorum": { "type": "any", "count": self.cfg.quorum },
                    "timeout_seconds": self.cfg.timeout.as_secs(),
                    "message": format!("Add transcript from {}: {preview}", m.sender),
                }),
            );
            self.stats.requested += 1;
            self.held.push_back(Held::Gate {
                id: request.id().to_string(),
                request: request.clone(),
                key: m.payload["key"].as_str().map(str::to_owned),
                add: e,
                approvers: Vec::new(),
                verdict: None,
                deadline: now + self.cfg.timeout + GRACE,
                copied: false,
            });
            return Some(request);
        }
        if self.held.is_empty() {
            return self.pass(e);
        }
        if e.kind() == Kind::ParticipantAnnounce {
            // A newer name makes an older one still waiting moot: it goes, and the newer waits
            // behind all that came before it. Not text, so not bounded by `room`: a sender
            // changing its RTCP name every report would otherwise grow what is held for as long
            // as no approver answers.
            let older = self
                .held
                .iter()
                .position(|h| matches!(h, Held::Plain(p) if p.kind() == Kind::ParticipantAnnounce));
            if let Some(Held::Plain(older)) = older.and_then(|i| self.held.remove(i)) {
                self.gone += 1;
                self.superseded.push(older.id());
            }
        }
        self.held.push_back(Held::Plain(e));
        None
    }

    /// A `gate.*` envelope from the server (any of the session's gates; others are ignored).
    pub fn on_server(&mut self, env: &Message) {
        let Some(gate) = env.payload["gate"].as_str() else {
            return;
        };
        let Some((approvers, verdict)) = self.held.iter_mut().find_map(|h| match h {
            Held::Gate {
                id,
                approvers,
                verdict,
                ..
            } if id == gate => Some((approvers, verdict)),
            _ => None,
        }) else {
            return;
        };
        if verdict.is_some() {
            return;
        }
        match env.kind.as_str() {
            "gate.approve" => {
                // The participant who approves is the one who sent it (the server checked its
                // approver role): a member naming another `approver` in each of its approvals
                // is still one participant (pvp-spec 14.2). Only an approval the server sends
                // under its own id names the approver in the payload alone.
                let who = if crate::pvp::from_server(&env.sender) {
                    env.payload["approver"].as_str().unwrap_or(&env.sender)
                } else {
                    &env.sender
                };
                if !approvers.iter().any(|a| a == who) {
                    approvers.push(who.to_owned());
                }
                if approvers.len() >= self.cfg.quorum as usize {
                    *verdict = Some(Verdict::Approved);
                }
            }
            "gate.reject" => *verdict = Some(Verdict::Rejected),
            // The server's word (pvp-spec 14.3: it resolves a gate at its timeout, per its
            // policy), not a member's: a server like the reference one checks the approver
            // role for `gate.approve` and `gate.reject` but relays a `gate.timeout` from anyone
            // as it came, which would let any member (an observer) approve a chunk unasked.
            "gate.timeout" if !crate::pvp::from_server(&env.sender) => {
                tracing::warn!(gate, sender = %env.sender, "gate.timeout not from the PVP server; not acted on");
            }
            "gate.timeout" => {
                *verdict = Some(if env.payload["resolution"] == "auto_approved" {
                    Verdict::Approved
                } else {
                    Verdict::TimedOut
                })
            }
            _ => {}
        }
    }

    /// The server answered the `gate.request` `request` with an `error` (pvp-spec 17: it made
    /// no gate, and no decision will come): its chunk is refused as a `gate.reject` would
    /// refuse it, at the next [`Gates::release`]. Not for a request written again after a
    /// reconnect ([`Gates::asked_again`]): a server that kept the gate (the connection, not
    /// the server, was lost) refuses the copy as a message it already took (pvp-spec 19.5:
    /// at most once), and its decision still comes; the chunk waits for it, or its timeout.
    pub fn refuse(&mut self, request: &str) -> Refusal {
        for h in &mut self.held {
            if let Held::Gate {
                id,
                verdict,
                copied,
                ..
            } = h
                && id == request
                && verdict.is_none()
            {
                if *copied {
                    return Refusal::Copy;
                }
                *verdict = Some(Verdict::Rejected);
                return Refusal::Refused;
            }
        }
        Refusal::Unknown
    }

    /// Resolves what can be resolved at `now`, in order: returns what to send, and the chunks
    /// (with their verdict) that will never be sent.
    pub fn release(&mut self, now: Instant) -> (Vec<Envelope>, Vec<(Envelope, Verdict)>) {
        let (mut send, mut dropped) = (Vec::new(), Vec::new());
        while let Some(front) = self.held.front_mut() {
            match front {
                Held::Gate {
                    verdict, deadline, ..
                } => {
                    if verdict.is_none() && *deadline <= now {
                        *verdict = Some(Verdict::TimedOut);
                    }
                    let Some(v) = *verdict else { break };
                    let Some(Held::Gate { add, key, .. }) = self.held.pop_front() else {
                        unreachable!()
                    };
                    match v {
                        Verdict::Approved => {
                            self.stats.approved += 1;
                            send.push(add);
                        }
                        other => {
                            if other == Verdict::Rejected {
                                self.stats.rejected += 1;
                            } else {
                                self.stats.timed_out += 1;
                            }
                            if let Some(k) = key {
                                self.refused_keys.insert(k);
                            }
                            self.gone += 1;
                            dropped.push((add, other));
                        }
                    }
                }
                Held::Plain(_) => {
                    let Some(Held::Plain(e)) = self.held.pop_front() else {
                        unreachable!()
                    };
                    send.extend(self.pass(e));
                }
            }
        }
        (send, dropped)
    }

    /// A correction of a chunk that was never approved goes nowhere.
    fn pass(&mut self, e: Envelope) -> Option<Envelope> {
        if self.refused_keys.corrects(&e) {
            self.gone += 1;
            self.dropped_corrections.push(e.id());
            return None;
        }
        Some(e)
    }

    /// The corrections dropped since the last call (counted in [`Gates::take_gone`] too).
    pub fn take_dropped_corrections(&mut self) -> Vec<ulid::Ulid> {
        std::mem::take(&mut self.dropped_corrections)
    }

    /// The chunks dropped for want of room since the last call (counted in
    /// [`Gates::take_gone`] too).
    pub fn take_crowded_out(&mut self) -> Vec<ulid::Ulid> {
        std::mem::take(&mut self.crowded_out)
    }

    /// The announces superseded since the last call (counted in [`Gates::take_gone`] too).
    pub fn take_superseded(&mut self) -> Vec<ulid::Ulid> {
        std::mem::take(&mut self.superseded)
    }

    /// The chunks approved and released since the last call (for `/metrics`).
    pub fn take_approved(&mut self) -> u64 {
        let n = self.stats.approved - self.approved_told;
        self.approved_told = self.stats.approved;
        n
    }

    /// How many envelopes from the core were dropped since the last call.
    pub fn take_gone(&mut self) -> u64 {
        std::mem::take(&mut self.gone)
    }

    /// Every chunk still awaiting a decision times out now (the gateway stops: README "Gated
    /// transcripts", a pending chunk is dropped), whatever its deadline; [`Gates::release`]
    /// then drops it and lets what waited behind it go.
    pub fn expire(&mut self) {
        for h in &mut self.held {
            if let Held::Gate {
                verdict: verdict @ None,
                ..
            } = h
            {
                *verdict = Some(Verdict::TimedOut);
            }
        }
    }

    /// Everything held, given up (the server refused the participant): the envelopes from the
    /// core, oldest first.
    pub fn abandon(&mut self) -> Vec<Envelope> {
        self.held
            .drain(..)
            .map(|h| match h {
                Held::Gate { add, .. } => add,
                Held::Plain(e) => e,
            })
            .collect()
    }

    /// The requests of the gates still awaiting a decision, oldest first, to send again (the
    /// same envelopes, so a server that still has a gate can tell the copy) after the
    /// connection is made again and the participant has rejoined.
    pub fn undecided(&self) -> impl Iterator<Item = &Envelope> {
        self.held.iter().filter_map(|h| match h {
            Held::Gate {
                request,
                verdict: None,
                ..
            } => Some(request),
            _ => None,
        })
    }

    /// The request `request` was written at `now` (again, after a reconnect or a refusal as
    /// RATE_LIMITED): a server that had lost its gate, or never made it, makes it now and
    /// times it out `timeout_seconds` from now, as its approvers are told; so the chunk waits
    /// that long and the grace from now, not from when it was first offered, for their
    /// decision. False if no undecided gate has that request.
    pub fn asked(&mut self, request: ulid::Ulid, now: Instant) -> bool {
        let request = request.to_string();
        for h in &mut self.held {
            if let Held::Gate {
                id,
                verdict: None,
                deadline,
                ..
            } = h
                && *id == request
            {
                *deadline = (*deadline).max(now + self.cfg.timeout + GRACE);
                return true;
            }
        }
        false
    }

    /// [`Gates::asked`] for a request written again on a new connection, after one it was
    /// written on was lost: the server may still have its gate ([`Gates::refuse`]).
    pub fn asked_again(&mut self, request: ulid::Ulid, now: Instant) -> bool {
        let id = request.to_string();
        for h in &mut self.held {
            if let Held::Gate {
                id: gate,
                verdict: None,
                copied,
                ..
            } = h
                && *gate == id
            {
                *copied = true;
            }
        }
        self.asked(request, now)
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.held.iter().find_map(|h| match h {
            Held::Gate {
                verdict: None,
                deadline,
                ..
            } => Some(*deadline),
            _ => None,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pvp: &mut Builder, kind: Kind, payload: serde_json::Value) -> Envelope {
        pvp.envelope(Time(0), "p".into(), kind, &payload)
    }

    /// A frame from the server.
    fn server(kind: &str, payload: serde_json::Value) -> Message {
        Message {
            v: 1,
            id: "01JAAAAAAAAAAAAAAAAAAAAAAA".into(),
            ts: "2026-11-22T00:00:00.000Z".into(),
            session: "s".into(),
            sender: "approver".into(),
            kind: kind.into(),
            payload,
            reference: None,
        }
    }

    #[test]
    fn chunks_wait_for_quorum_in_order_and_rejections_take_their_corrections() {
        let mut pvp = Builder::new("s".into(), None, 1);
        let mut g = Gates::new(
            GateConfig {
                quorum: 2,
                timeout: Duration::from_secs(30),
            },
            64,
        );
        let t = Instant::now();
        let a = env(
            &mut pvp,
            Kind::ContextAdd,
            json!({"key": "k1", "content": "one"}),
        );
        let b = env(
            &mut pvp,
            Kind::ContextAdd,
            json!({"key": "k2", "content": "two"}),
        );
        let ra = g.offer(a.clone(), &mut pvp, t, Time(0)).unwrap();
        assert_eq!(ra.kind(), Kind::GateRequest);
        let request = ra.to_message();
        assert_eq!(request.payload["action_ref"], a.id().to_string());
        assert_eq!(request.payload["action_type"], "context_change");
        let rb = g.offer(b.clone(), &mut pvp, t, Time(0)).unwrap();
        let upd = env(
            &mut pvp,
            Kind::ContextUpdate,
            json!({"key": "k2", "new_content": "tw", "reason": "bs"}),
        );
        assert!(
            g.offer(upd, &mut pvp, t, Time(0)).is_none(),
            "waits behind the gates"
        );
        // b is rejected first; a needs two approvals; nothing goes out before a resolves.
        g.on_server(&server(
            "gate.reject",
            json!({"gate": rb.id().to_string(), "rejector": "x", "reason": "no"}),
        ));
        let mut approve = server(
            "gate.approve",
            json!({"gate": ra.id().to_string(), "approver": "x"}),
        );
        approve.sender = "x".into();
        g.on_server(&approve);
        assert!(g.release(t).0.is_empty());
        let mut approve = server(
            "gate.approve",
            json!({"gate": ra.id().to_string(), "approver": "y"}),
        );
        approve.sender = "y".into();
        g.on_server(&approve);
        let (send, dropped) = g.release(t);
        assert_eq!(send.iter().map(Envelope::id).collect::<Vec<_>>(), [a.id()]);
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].1, Verdict::Rejected);
        assert!(g.is_empty());
        assert_eq!(
            g.stats,
            GateStats {
                requested: 2,
                approved: 1,
                rejected: 1,
                timed_out: 0
            }
        );
    }

    #[test]
    fn unanswered_gates_time_out_and_auto_approval_sends() {
        let mut pvp = Builder::new("s".into(), None, 1);
        let mut g = Gates::new(
            GateConfig {
                quorum: 1,
                timeout: Duration::from_secs(10),
            },
            64,
        );
        let t = Instant::now();
        let a = env(&mut pvp, Kind::ContextAdd, json!({"key": "k1"}));
        let b = env(&mut pvp, Kind::ContextAdd, json!({"key": "k2"}));
        g.offer(a, &mut pvp, t, Time(0)).unwrap();
        let rb = g.offer(b.clone(), &mut pvp, t, Time(0)).unwrap();
        let mut timeout = server(
            "gate.timeout",
            json!({"gate": rb.id().to_string(), "resolution": "auto_approved", "approvals_received": 0, "approvals_required": 1}),
        );
        timeout.sender = "system".into();
        g.on_server(&timeout);
        assert_eq!(g.next_deadline(), Some(t + Duration::from_secs(15)));
        let (send, dropped) = g.release(t + Duration::from_secs(15));
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].1, Verdict::TimedOut);
        assert_eq!(send.iter().map(Envelope::id).collect::<Vec<_>>(), [b.id()]);
    }

    /// A stop expires every pending gate whatever its deadline (a day and 5 s away here), and
    /// what waited behind goes; chunks offered with `room` envelopes held are dropped unasked,
    /// their corrections with them. A review found both (review, session 34).
    #[test]
    fn gates_hold_at_most_their_room_and_a_stop_expires_every_pending_one() {
        let mut pvp = Builder::new("s".into(), None, 1);
        let mut g = Gates::new(
            GateConfig {
                quorum: 1,
                timeout: Duration::from_secs(86_400),
            },
            2,
        );
        let t = Instant::now();
        let add = |pvp: &mut Builder, k: &str| env(pvp, Kind::ContextAdd, json!({"key": k}));
        let (a, b, c) = (
            add(&mut pvp, "k1"),
            add(&mut pvp, "k2"),
            add(&mut pvp, "k3"),
        );
        assert!(g.offer(a.clone(), &mut pvp, t, Time(0)).is_some());
        assert!(g.offer(b.clone(), &mut pvp, t, Time(0)).is_some());
        assert!(
            g.offer(c.clone(), &mut pvp, t, Time(0)).is_none(),
            "no room"
        );
        assert_eq!(g.take_crowded_out(), [c.id()]);
        assert_eq!(g.take_gone(), 1);
        let upd = env(
            &mut pvp,
            Kind::ContextUpdate,
            json!({"key": "k3", "new_content": "", "reason": "bs"}),
        );
        let leave = env(&mut pvp, Kind::SessionLeave, json!({}));
        assert!(g.offer(upd.clone(), &mut pvp, t, Time(0)).is_none());
        assert!(g.offer(leave.clone(), &mut pvp, t, Time(0)).is_none());
        assert!(g.release(t).0.is_empty(), "undecided");
        g.expire();
        let (send, dropped) = g.release(t);
        assert_eq!(
            send.iter().map(Envelope::id).collect::<Vec<_>>(),
            [leave.id()]
        );
        let dropped: Vec<_> = dropped.iter().map(|(e, v)| (e.id(), *v)).collect();
        assert_eq!(
            dropped,
            [(a.id(), Verdict::TimedOut), (b.id(), Verdict::TimedOut)]
        );
        assert_eq!(g.take_dropped_corrections(), [upd.id()]);
        assert!(g.is_empty());
    }

    /// A speaker who keeps typing and backspacing while no approver answers: each chunk is
    /// crowded out at the bound, and each correction of one is dropped as it comes, not held
    /// behind the pending gates (where the held envelopes grew without bound, past the
    /// participant's queue bound); corrections of a held chunk count against the room too. A
    /// review found it (review, session 34).
    #[test]
    fn corrections_of_crowded_out_chunks_do_not_grow_the_gates_past_their_room() {
        let mut pvp = Builder::new("s".into(), None, 3);
        let room = 2;
        let mut g = Gates::new(
            GateConfig {
                quorum: 1,
                timeout: Duration::from_secs(86_400),
            },
            room,
        );
        let t = Instant::now();
        let add = |pvp: &mut Builder, k: &str| env(pvp, Kind::ContextAdd, json!({"key": k}));
        let remove = |pvp: &mut Builder, k: &str| env(pvp, Kind::ContextRemove, json!({"key": k}));
        let a = add(&mut pvp, "a");
        assert!(g.offer(a, &mut pvp, t, Time(0)).is_some());
        let b = add(&mut pvp, "b");
        assert!(g.offer(b, &mut pvp, t, Time(0)).is_some());
        for i in 0..1_000 {
            let k = format!("erased {i}");
            let (chunk, erase) = (add(&mut pvp, &k), remove(&mut pvp, &k));
            assert!(g.offer(chunk, &mut pvp, t, Time(0)).is_none(), "no room");
            assert!(g.offer(erase.clone(), &mut pvp, t, Time(0)).is_none());
            assert_eq!(
                g.take_dropped_corrections(),
                [erase.id()],
                "dropped at once"
            );
        }
        assert_eq!(g.take_crowded_out().len(), 1_000);
        assert_eq!(g.take_gone(), 2_000);
        // A correction of a held chunk, at the bound, is crowded out too.
        let upd = env(
            &mut pvp,
            Kind::ContextUpdate,
            json!({"key": "b", "new_content": "", "reason": "bs"}),
        );
        assert!(g.offer(upd.clone(), &mut pvp, t, Time(0)).is_none());
        assert_eq!(g.take_crowded_out(), [upd.id()]);
        assert_eq!(g.abandon().len(), room);
    }

    /// A sender whose RTCP alternates between two names (every compound, so at up to
    /// `--max-pps-per-source` a second) makes a `participant.announce` each time (pvp-spec 7.1).
    /// Behind a pending gate each was held, uncounted against the room (it is not text): with
    /// nobody answering for up to `--gate-timeout-s` (a day), the held envelopes grew without
    /// bound. Found by review ao (session 45). Only the newest name waits now, behind what
    /// came before it, the older ones superseded (nothing lost: the newest is what the
    /// participant is called).
    #[test]
    fn announces_behind_a_pending_gate_do_not_grow_it_past_its_room() {
        let mut pvp = Builder::new("s".into(), None, 5);
        let room = 4;
        let mut g = Gates::new(
            GateConfig {
                quorum: 1,
                timeout: Duration::from_secs(86_400),
            },
            room,
        );
        let t = Instant::now();
        let a = env(&mut pvp, Kind::ContextAdd, json!({"key": "a"}));
        let request = g.offer(a.clone(), &mut pvp, t, Time(0)).unwrap();
        let mut newest = None;
        for i in 0..10_000 {
            let name = if i % 2 == 0 { "Ada" } else { "Bob" };
            let e = env(&mut pvp, Kind::ParticipantAnnounce, json!({"name": name}));
            assert!(g.offer(e.clone(), &mut pvp, t, Time(0)).is_none(), "waits");
            newest = Some(e);
        }
        assert_eq!(g.take_superseded().len(), 9_999);
        assert_eq!(g.take_gone(), 9_999, "settled");
        let mut approve = server(
            "gate.approve",
            json!({"gate": request.id().to_string(), "approver": "x"}),
        );
        approve.sender = "x".into();
        g.on_server(&approve);
        let (send, dropped) = g.release(t);
        assert!(dropped.is_empty());
        assert_eq!(
            send.iter().map(Envelope::id).collect::<Vec<_>>(),
            [a.id(), newest.unwrap().id()],
            "the chunk, then the newest name"
        );
        assert!(g.is_empty());
    }
}
