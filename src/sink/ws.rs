//! PVP over WebSocket (pvp-spec 19.1), one connection per virtual participant.
//!
//! PVP servers bind a connection to the `sender` of its first frame (and track presence and
//! announce `session.leave` per connection), so each T.140 stream gets its own connection,
//! opened lazily with its `session.join`. Each connection is a task fed by a bounded queue: the
//! UDP loop never waits on a socket. A connection answers the server's `heartbeat.ping` (not
//! another member's, nor its own read back), sends its own ping
//! every `heartbeat` so its participant stays active, and logs every `error` it is sent. A
//! server that has gone quiet is probed with a WebSocket ping and left once `silence` passes
//! (`Liveness`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::UrlError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::oversize::SkipOversize;

use super::SinkStats;
use crate::clock::random_seed;
use crate::pvp::{Builder, Envelope, ErrorPayload, Kind, SenderId, splitmix};
use crate::refused::RefusedItems;
use crate::time::Time;

#[derive(Debug, Clone)]
pub struct WsConfig {
    pub url: String,
    pub session: String,
    pub heartbeat: Duration,
    /// A connect (TCP, TLS, handshake) that takes longer failed: a blackholed address or a
    /// server that accepts and never answers would otherwise hold the participant for the
    /// kernel's TCP timeouts (minutes) or for ever.
    pub connect_timeout: Duration,
    /// A frame the connection has not taken within this long means the server stopped
    /// reading: the connection is dropped and made again.
    pub write_timeout: Duration,
    /// Nothing heard from the server for this long (not a frame, not the answer to the
    /// WebSocket ping sent after each silent heartbeat interval) means it is gone: the
    /// connection is dropped and made again.
    pub silence: Duration,
    /// Envelopes a participant may have waiting for its connection before new ones are refused.
    pub queue: usize,
    pub metrics: crate::metrics::SinkMetrics,
    /// For `wss://`: the rustls configuration (system roots plus `--ca-file`).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `--spool`: journal every envelope before sending and mark it once delivered (text once
    /// seen read, see `Retry`).
    pub spool: Option<Arc<super::spool::Spool>>,
    /// `--gate-transcripts`: chunks wait for approval (see [`super::gate`]).
    pub gate: Option<super::gate::GateConfig>,
}

struct Conn {
    tx: mpsc::Sender<(std::time::Instant, Envelope)>,
    task: JoinHandle<()>,
    /// Items its full queue refused, whose corrections are refused too (pvp-spec 9.3); made
    /// at the first.
    refused: Option<Box<RefusedItems>>,
    /// Its queue's drops, logged at the first and then at most every 10 s: a participant the
    /// server refused, or one speaking through an outage, drops every envelope it makes, and
    /// a line each flooded the log (each is counted in `_participant_queue_refused_total`).
    drops: crate::said::Said<std::time::Instant>,
}

/// Items a participant's queue remembers refusing: a correction names its speaker's last
/// item, and a participant is one speaker, or a few a mapping rule names alike.
const REFUSED_KEPT: usize = 16;

/// Sessions the server ended (pvp-spec 6.5 `session.end`), by [`Route::session`]: shared by
/// the sink, which drops what is queued for them from then on, and every connection, which
/// reads the end its server broadcast to each member: the first to read it says so, once.
#[derive(Default)]
struct Ended {
    any: std::sync::atomic::AtomicBool,
    sessions: std::sync::Mutex<std::collections::HashSet<Box<str>>>,
}

impl Ended {
    fn contains(&self, session: &str) -> bool {
        self.any.load(Ordering::Relaxed)
            && self
                .sessions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(session)
    }
    /// Whether this call ended it (the first to).
    fn end(&self, session: &str) -> bool {
        let first = self
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session.into());
        self.any.store(true, Ordering::Relaxed);
        first
    }
}

/// What a connection is for: one participant in one session. A server binds a connection to
/// the sender and session of its first frame (pvp-spec 19.1), and one id may speak in two
/// sessions (a `[[stream]]` rule's participant in two rooms): each is its own connection.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Route {
    /// As the envelope's JSON has it ([`Envelope::session_json`]).
    session: Box<str>,
    sender: SenderId,
}

impl Route {
    fn of(e: &Envelope) -> Self {
        Route {
            session: e.session_json().into(),
            sender: e.sender().clone(),
        }
    }
}

pub struct WsSink {
    cfg: Arc<WsConfig>,
    conns: HashMap<Route, Conn>,
    /// Connections of participants that have left, still delivering what they hold (their
    /// leave last). A participant that joins again (the same stream back after a timeout, or
    /// a restart's resend beside live traffic) gets a new connection that waits for this one
    /// to finish: two connections of one sender are otherwise unordered, and the old leave
    /// could reach the server after the new join (pvp-spec 19.5: per-sender order).
    leaving: HashMap<Route, JoinHandle<()>>,
    /// `leaving`'s size at which finished connections are next swept from it.
    sweep_at: usize,
    sent: Arc<AtomicU64>,
    dropped: u64,
    /// One join and one leave a participant id, whatever the speakers sharing it.
    presence: crate::presence::Presence,
    /// Envelopes taken into a connection's queue, and of them those each connection has
    /// settled: written, or given up on and counted where it gave up. What is unsettled when
    /// the shutdown's grace ends was lost, and is counted as dropped.
    accepted: u64,
    settled: Arc<AtomicU64>,
    /// Envelopes a connection settled by giving them up (its participant refused by the
    /// server): dropped, in the sink's totals.
    given_up: Arc<AtomicU64>,
    /// Set when the sink closes: a connection whose participant has left but whose chunks
    /// still await approval stops waiting for the decisions then.
    stop: tokio::sync::watch::Sender<bool>,
    /// Sessions the server ended.
    ended: Arc<Ended>,
}

impl WsSink {
    pub fn new(cfg: WsConfig) -> Self {
        WsSink {
            cfg: Arc::new(cfg),
            conns: HashMap::new(),
            leaving: HashMap::new(),
            sweep_at: SWEEP_FROM,
            sent: Arc::new(AtomicU64::new(0)),
            dropped: 0,
            presence: Default::default(),
            accepted: 0,
            settled: Arc::new(AtomicU64::new(0)),
            given_up: Arc::new(AtomicU64::new(0)),
            stop: tokio::sync::watch::channel(false).0,
            ended: Arc::default(),
        }
    }

    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    pub fn send(&mut self, e: Envelope) {
        if !self.presence.admit(&e) {
            return;
        }
        if e.kind() == Kind::SessionJoin {
            self.cfg.metrics.participants.inc();
        }
        if let Some(spool) = &self.cfg.spool {
            spool.added(&e);
        }
        self.enqueue(e);
    }

    /// Sends the envelopes the spool already holds (the resend after a restart), oldest first.
    /// Each participant's queue is made room for its share at once: after an outage the spool
    /// may hold a full queue's worth for one participant, and its rejoin and leave with them.
    pub fn resend(&mut self, envelopes: Vec<Envelope>) {
        let mut share: HashMap<Route, usize> = HashMap::new();
        for e in &envelopes {
            *share.entry(Route::of(e)).or_default() += 1;
        }
        for e in envelopes {
            let extra = share.get(&Route::of(&e)).copied().unwrap_or(0);
            self.enqueue_with_room(e, self.cfg.queue + extra);
        }
    }

    fn enqueue(&mut self, e: Envelope) {
        self.enqueue_with_room(e, self.cfg.queue);
    }

    /// Queues `e` on its participant's connection, opening one whose queue holds `room` if it
    /// has none. The queue has one place more, kept for the leave: text is what a full queue
    /// gives up, never the end of the participant's presence (pvp-spec 6), which a server
    /// would otherwise keep for ever.
    fn enqueue_with_room(&mut self, e: Envelope, room: usize) {
        let leaving = e.kind() == Kind::SessionLeave;
        let route = Route::of(&e);
        if self.ended.contains(&route.session) {
            // pvp-spec 6.5: the server takes nothing more for a session it ended. Counted,
            // not written to be refused one by one, and no connection made for it.
            self.dropped += 1;
            self.cfg.metrics.session_ended_items.inc();
            if let Some(spool) = &self.cfg.spool {
                spool.done(e.id());
            }
            tracing::debug!(participant = %route.sender, id = %e.id(), kind = %e.kind(), "PVP session ended; envelope dropped");
            if leaving && let Some(conn) = self.conns.remove(&route) {
                self.leaving.insert(route, conn.task);
            }
            return;
        }
        if !self.conns.contains_key(&route) {
            let (tx, rx) = mpsc::channel(room + 1);
            let before = self.leaving.remove(&route);
            // The connection's own envelopes (pongs, heartbeats, gate requests) go to its
            // participant's session from its first frame, which may answer a server's ping
            // before the join is written; a mapping rule may have routed it off `--session`.
            let session_id = e.to_message().session;
            let session = crate::pvp::SessionText::new(&session_id);
            let task = tokio::spawn(connection(
                self.cfg.clone(),
                e.sender().clone(),
                (
                    session,
                    self.ended.clone(),
                    route.session.clone(),
                    session_id,
                ),
                rx,
                Counts {
                    sent: self.sent.clone(),
                    settled: self.settled.clone(),
                    given_up: self.given_up.clone(),
                },
                before,
                self.stop.subscribe(),
            ));
            self.conns.insert(
                route.clone(),
                Conn {
                    tx,
                    task,
                    refused: None,
                    drops: crate::said::Said::default(),
                },
            );
        }
        let conn = self.conns.get_mut(&route).expect("made above");
        let queued = if conn.tx.is_closed() {
            // The connection task ended: the server refused the participant, or the sink is
            // stopping.
            Err((e, "PVP connection closed"))
        } else if conn.refused.as_ref().is_some_and(|r| r.corrects(&e)) {
            Err((e, "correction of an item the full queue refused"))
        } else if !leaving && conn.tx.capacity() <= 1 {
            // The last place is the leave's.
            Err((e, "PVP connection queue full"))
        } else {
            conn.tx
                .try_send((std::time::Instant::now(), e))
                .map_err(|err| match err {
                    mpsc::error::TrySendError::Full((_, e)) => (e, "PVP connection queue full"),
                    mpsc::error::TrySendError::Closed((_, e)) => (e, "PVP connection closed"),
                })
        };
        if let Err((e, why)) = queued {
            self.dropped += 1;
            self.cfg.metrics.participant_queue_refused.inc();
            if e.kind() == Kind::ContextAdd {
                conn.refused
                    .get_or_insert_with(|| Box::new(RefusedItems::new(REFUSED_KEPT)))
                    .refused(&e);
            }
            // Given up on, so not resent after a restart either, where it would come after
            // what this participant said later.
            if let Some(spool) = &self.cfg.spool {
                spool.done(e.id());
            }
            if let Some(dropped) = conn.drops.tell(std::time::Instant::now(), 1) {
                tracing::warn!(participant = %route.sender, id = %e.id(), kind = %e.kind(), dropped, "{why}; envelope dropped (this participant's drops are logged at most every 10 s, with how many since)");
            } else {
                tracing::debug!(participant = %route.sender, id = %e.id(), kind = %e.kind(), "{why}; envelope dropped");
            }
        } else {
            self.accepted += 1;
        }
        if leaving && let Some(conn) = self.conns.remove(&route) {
            // Dropping the queue's sender lets the task deliver what is left, then close.
            self.leaving.insert(route, conn.task);
            if self.leaving.len() >= self.sweep_at {
                self.leaving.retain(|_, t| !t.is_finished());
                self.sweep_at = (2 * self.leaving.len()).max(SWEEP_FROM);
            }
        }
    }

    pub async fn close(mut self, grace: Duration) -> SinkStats {
        self.stop.send_replace(true);
        let tasks = self
            .conns
            .drain()
            .map(|(_, c)| c.task)
            .chain(self.leaving.drain().map(|(_, t)| t));
        let all = futures_util::future::join_all(tasks);
        if tokio::time::timeout(grace, all).await.is_err() {
            tracing::warn!("PVP connections did not finish within {grace:?}");
        }
        let lost = self
            .accepted
            .saturating_sub(self.settled.load(Ordering::Relaxed));
        if lost > 0 {
            // Without --spool they are gone; with it, the next start sends them.
            tracing::warn!(
                undelivered = lost,
                "envelopes still waiting for their PVP connection when the shutdown's grace ended"
            );
            self.dropped += lost;
        }
        if let Some(spool) = self.cfg.spool.clone() {
            // The journal's last records (the leaves' marks) are on disk before the process
            // goes; waited for off this thread, which still serves any connection left.
            let _ = tokio::task::spawn_blocking(move || spool.flush()).await;
        }
        SinkStats {
            sent: self.sent.load(Ordering::Relaxed),
            dropped: self.dropped + self.given_up.load(Ordering::Relaxed),
        }
    }
}

/// Text from the server, as a log line shows it: its control characters escaped (`\n` as
/// `\\n`), so that a newline in a Close reason or an error's message, from a hostile or broken
/// server, cannot start a log line of the server's making in the text log format.
struct Printable<'a>(&'a str);

impl std::fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// The server closed the connection `opened` then, with `frame` (its code and reason tell a
/// refused token or session from a server going away): at warn level, unless the connection
/// before was closed as early (`closing_early`), whose streak was logged at its first.
fn closed_log(
    participant: &str,
    frame: Option<&tokio_tungstenite::tungstenite::protocol::CloseFrame>,
    closing_early: &mut bool,
    opened: Option<tokio::time::Instant>,
) {
    let early = opened.is_some_and(|t| t.elapsed() < STABLE);
    let again = std::mem::replace(closing_early, early);
    let code = frame.map_or(String::new(), |f| u16::from(f.code).to_string());
    let reason = Printable(frame.map_or("", |f| f.reason.as_str()));
    if again {
        tracing::debug!(%participant, %code, %reason, "PVP server closed the connection again soon after it opened; reconnecting");
    } else {
        tracing::warn!(%participant, %code, %reason, "PVP server closed the connection; reconnecting");
    }
}

/// The connection `opened` then failed with `err` (a reset, the TCP connection ended without
/// a Close, a frame RFC 6455 says fails it): at warn level, unless the connection before ended
/// as early (`closing_early`), as [`closed_log`] logs a Close. A server or proxy that takes the
/// handshake and then drops every connection without a Close is told so (tungstenite reports
/// it as an error, not as the stream's end).
fn failed_log(
    participant: &str,
    err: &tungstenite::Error,
    closing_early: &mut bool,
    opened: Option<tokio::time::Instant>,
) {
    let early = opened.is_some_and(|t| t.elapsed() < STABLE);
    if std::mem::replace(closing_early, early) {
        tracing::debug!(%participant, "PVP connection failed again soon after it opened: {err}; reconnecting");
    } else {
        tracing::warn!(%participant, "PVP connection failed: {err}; reconnecting");
    }
}

fn now() -> Time {
    Time::from_system(SystemTime::now())
}

/// Finished connections are swept from [`WsSink::leaving`] once it has grown to twice its
/// size after the last sweep, and not below this: a sweep a leave would cost a scan of every
/// participant still delivering, on the sink's thread.
const SWEEP_FROM: usize = 64;

/// How long a connection must have lived for its end to reset the backoff (the next wait is
/// the first's, 50-100 ms): a server that accepts and then closes every connection is not
/// hammered, and the participant counts as failing meanwhile.
const STABLE: Duration = Duration::from_secs(10);

/// A participant not rate-limited for this long starts its next pause at the smallest again:
/// the pause doubles while RATE_LIMITED repeats, not for the rest of the connection's life.
const RATE_CALM: Duration = Duration::from_secs(60);

/// The pause after a RATE_LIMITED (pvp-spec 17): double the last, from 500 ms to 30 s, or the
/// smallest again when the last came `since` ago, at least [`RATE_CALM`].
fn rate_pause(last: Duration, since: Option<Duration>) -> Duration {
    if since.is_some_and(|s| s >= RATE_CALM) {
        return Duration::from_millis(500);
    }
    (last * 2).clamp(Duration::from_millis(500), Duration::from_secs(30))
}

/// The sink's counters a connection adds to.
struct Counts {
    /// Frames written that carried an envelope from the queue (not a gate's request).
    sent: Arc<AtomicU64>,
    /// Envelopes from the queue written or given up on (see [`WsSink::settled`]).
    settled: Arc<AtomicU64>,
    /// Of those settled, the ones given up on (see [`WsSink::given_up`]).
    given_up: Arc<AtomicU64>,
}

impl Counts {
    fn settled(&self, n: u64) {
        self.settled.fetch_add(n, Ordering::Relaxed);
    }
}

/// One participant's connection: after its previous connection has finished (`before`, if it
/// left and came back), connect (with backoff), send its join first, then the queue.
async fn connection(
    cfg: Arc<WsConfig>,
    participant: SenderId,
    // The session's text for the connection's own envelopes; the sessions ended, and this
    // one's as the route has it and as its envelopes carry it.
    (session, ended, route_session, session_id): (
        crate::pvp::SessionText,
        Arc<Ended>,
        Box<str>,
        String,
    ),
    mut rx: mpsc::Receiver<(std::time::Instant, Envelope)>,
    counts: Counts,
    before: Option<JoinHandle<()>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    if let Some(before) = before {
        // Its result does not matter (a refusal ends it early too): only that it has written
        // all it will write.
        let _ = before.await;
    }
    let m = &cfg.metrics;
    let mut connected_before = false;
    let mut failing = false;
    // The server closed a connection within `STABLE` of its opening, and has not let one live
    // longer since: its next closes are logged at debug level, as a failed connect's retries.
    let mut closing_early = false;
    let mut pvp = Builder::new(cfg.session.clone(), None, random_seed());
    pvp.session = session;
    let mut join: Option<Envelope> = None;
    // The id of the last rejoin made after a reconnect, and whether the server refused it as
    // RATE_LIMITED, so that it is made again once the pause is over.
    let mut rejoined: Option<ulid::Ulid> = None;
    let mut rejoin_again = false;
    // The rejoin to be made is for PARTICIPANT_NOT_FOUND: the server lost the gates the
    // participant asked for with it, and they are asked again after it.
    let mut forgotten = false;
    // The last `participant.announce` written since the last (re)join, so that one the server
    // refuses as RATE_LIMITED goes again after the pause; a later announce, or a rejoin (which
    // carries the name it announced), stands for it.
    let mut announced: Option<Envelope> = None;
    // Ids of the last few heartbeats, pongs and rejoins the connection made itself and wrote,
    // so that a refusal naming one is told as such (nothing lost; a heartbeat is not sent
    // again, and a refused rejoin only if it is the last, `rejoined`).
    let mut own: VecDeque<(ulid::Ulid, Kind)> = VecDeque::new();
    // The session's members the server announced as admins (pvp-spec 6.5: an admin ends a
    // session): a `session.end` from anyone else (a server relaying it unchecked, as the
    // reference one does) is not acted on. The newest [`MAX_ADMINS`]: members announcing
    // themselves admins without end do not grow every connection's memory.
    let mut admins: Vec<Box<str>> = Vec::new();
    // Ids of recent envelopes, so an `error`'s `related_to` can be told in the log.
    // Grown as envelopes are written: most participants write a few, and 10,000 connections
    // reserving 64 entries each held 15 MiB.
    let mut recent: VecDeque<(ulid::Ulid, Kind)> = VecDeque::new();
    // Ids (hashed, `id_hash`) of the last RECENT RATE_LIMITED errors acted on, the newest
    // last, grown as they come; kept across reconnects like `recent`: one read again is not
    // acted on again.
    let mut refusals: VecDeque<u64> = VecDeque::new();
    // The last text written, in case the server refuses it as RATE_LIMITED.
    let mut retry = Retry::new(random_seed() as u64, cfg.spool.clone());
    let mut pending: Option<(std::time::Instant, Envelope)> = None;
    // RATE_LIMITED (pvp-spec 17) pauses sending; the pause doubles while it repeats.
    let mut paused_until: Option<tokio::time::Instant> = None;
    // When this connection saw the gateway stop (or the sink go): a wait for the pong is cut
    // short from then ([`STOP_PONG_WAIT`]).
    let mut stop_seen: Option<std::time::Instant> = None;
    let mut rate_backoff = Duration::from_millis(250);
    // When the server last rate-limited: after a calm minute the pause starts small again.
    let mut rate_limited_at: Option<tokio::time::Instant> = None;
    // Envelopes to send before taking more from the queue (released by gates).
    let mut outbox: VecDeque<(std::time::Instant, Envelope)> = VecDeque::new();
    // What awaits approval counts against the queue's bound (the place kept for the leave
    // aside): a resend's queue, made larger for it, holds more.
    let room = rx.max_capacity().saturating_sub(1);
    let mut gates = cfg.gate.map(|g| super::gate::Gates::new(g, room));
    let mut backoff = Duration::from_millis(100);
    // The connection's own random numbers for `retry_delay`.
    let mut jitter = random_seed();
    // When the last connection opened: one that ends soon after (a server accepting and then
    // closing, or failing) is made again after the backoff, not at once, and the backoff
    // grows; one that lived `STABLE` resets it.
    let mut opened: Option<tokio::time::Instant> = None;
    // False once the queue has closed: the participant left (its leave is queued, behind any
    // chunk awaiting approval) or the gateway stops.
    let mut queue_open = true;
    'reconnect: loop {
        if join.is_some() {
            // Text the lost connection took and the server was not seen to read goes again
            // after the rejoin. Taken back now, not once connected again: a stop while the
            // server is still unreachable counts it as undelivered (and, with --spool, the
            // journal has it undelivered again for the next start), not as sent.
            let unread = retry.unread(&mut recent, &cfg, &counts);
            if !unread.is_empty() {
                m.unread_resent.inc_by(unread.len() as u64);
                // At debug: the reconnect's own line is at info already, and an outage
                // reconnects every participant (the metric counts it).
                tracing::debug!(%participant, texts = unread.len(), "text written into the lost connection before the server was seen to read it goes again");
                retry.put_back(unread, &mut pending, &mut outbox);
            }
        } else {
            // The participant left (its leave written): no rejoin.
            retry.give_up_unread(&mut recent, &cfg, &counts, &participant);
        }
        if let Some(at) = opened.take() {
            if at.elapsed() >= STABLE {
                backoff = Duration::from_millis(100);
                closing_early = false;
            } else if !failing {
                // A server that takes the handshake and drops the connection is failing this
                // participant as one that refuses it: in backoff, so /healthz says so.
                m.failing.inc();
                failing = true;
            }
            // Even after a reset, a random part of the first wait: participants that lost a
            // restarting server (or a proxy's every connection) come back spread out.
            backoff_wait(next_wait(&mut backoff, &mut jitter), &stop).await;
        }
        // Boxed: the handshake's state (10 KB) is then held only while connecting, not for
        // the connection's life inside every participant's task.
        let connecting = Box::pin(connect(&cfg));
        let connected = match tokio::time::timeout(cfg.connect_timeout, connecting).await {
            Ok(r) => r.map_err(|e| connect_failure(&e)),
            Err(_) => Err(format!("no answer within {:?}", cfg.connect_timeout)),
        };
        // One stream for reading and writing, not split: `select!` drops its futures before a
        // branch's handler runs, so the handler may write, and a split's lock would cost
        // every frame read (with an echoing server, every envelope N times).
        let mut ws = match connected {
            Ok(ws) => {
                opened = Some(tokio::time::Instant::now());
                // A participant's first connection is logged at debug level (its join is at
                // info already: two lines a participant, not four); one made again after a drop
                // or a failure, at info.
                if connected_before || failing {
                    m.reconnects.inc();
                    tracing::info!(%participant, url = %super::ShownUrl(&cfg.url), "PVP connection open again");
                } else {
                    tracing::debug!(%participant, url = %super::ShownUrl(&cfg.url), "PVP connection open");
                }
                if failing {
                    m.failing.dec();
                    failing = false;
                }
                connected_before = true;
                m.connections.inc();
                ws
            }
            Err(err) => {
                let wait = next_wait(&mut backoff, &mut jitter);
                // Once an outage at warn level, its retries at debug: thousands of participants
                // retrying for minutes would otherwise flood the log (`failing` counts them).
                if failing {
                    tracing::debug!(%participant, url = %super::ShownUrl(&cfg.url), "PVP connect failed: {err}; retrying in {wait:?}");
                } else {
                    m.failing.inc();
                    failing = true;
                    tracing::warn!(%participant, url = %super::ShownUrl(&cfg.url), "PVP connect failed: {err}; retrying in {wait:?}, then at doubling intervals (logged at debug level)");
                }
                backoff_wait(wait, &stop).await;
                continue;
            }
        };
        let _open = ConnGuard(m.connections.clone());
        if ended.contains(&route_session) {
            // pvp-spec 6.5: the server ended the session while this connection was down (or
            // before its first): the end went to the members connected then. No rejoin into
            // it; what the participant holds is dropped, as where a connection reads the end.
            send_frame(&mut ws, Message::Close(None), &cfg, &participant).await;
            let lost = give_up_all(
                &mut rx,
                &mut pending,
                &mut outbox,
                &mut gates,
                &cfg,
                &counts,
            )
            .await;
            m.session_ended_items.inc_by(lost);
            retry.let_go();
            tracing::debug!(%participant, undelivered = lost, "PVP session ended while the connection was down; participant stopped");
            return;
        }
        // After a reconnect the server has forgotten us: join again (a fresh id, same content).
        if let Some(j) = &join {
            let Some(again_id) = rejoin(&mut ws, &mut pvp, j, &cfg, &participant).await else {
                continue 'reconnect;
            };
            rejoined = Some(again_id);
            remember_own(&mut own, (again_id, Kind::SessionJoin));
            rejoin_again = false;
            forgotten = false;
            stand_for(
                again_id,
                &mut recent,
                &mut announced,
                &mut outbox,
                &mut retry,
                &counts,
            );
            // Chunks held for approval are asked about again: a decision for a request the
            // old connection carried may never come now (a restarted server has no gate).
            if !ask_again(
                &mut ws,
                &mut gates,
                &pending,
                &mut outbox,
                &cfg,
                &participant,
                &counts,
            )
            .await
            {
                continue 'reconnect;
            }
        }
        let mut heartbeat = heartbeat_ticks(cfg.heartbeat);
        let mut alive = Liveness::new(cfg.heartbeat, cfg.silence);
        loop {
            let paused = paused_until.is_some_and(|t| t > tokio::time::Instant::now());
            // Text unread up to the bound: no more written until the pong ([`UNREAD_WAIT`]).
            // Once the gateway stops (or the sink is gone), the wait is cut to
            // [`STOP_PONG_WAIT`] from when the stop was seen, within the stop's grace.
            let stopping_now = stop.has_changed().is_err() || *stop.borrow();
            if stopping_now && stop_seen.is_none() {
                stop_seen = Some(std::time::Instant::now());
            }
            let full_until = match (retry.full_until(), stop_seen) {
                (Some(t), Some(s)) => Some(t.min(s + STOP_PONG_WAIT)),
                (t, _) => t,
            }
            .filter(|&t| t > std::time::Instant::now());
            // The gateway stops with text unread up to the bound and no pong came: the rest of
            // the queue is not written (written, it would let the oldest go, marked done in
            // the journal though the server was never seen to read it), but counted dropped
            // and left undelivered in the journal for the next start, as what the stop's grace
            // leaves queued is.
            if stopping_now && queue_open && full_until.is_none() && retry.at_unread_bound() {
                hold_back_queue(&mut rx, &counts, &participant).await;
                let held = Held::new(
                    &mut pending,
                    &mut outbox,
                    &mut gates,
                    paused_until,
                    join.as_ref().filter(|_| rejoin_again),
                    &mut pvp,
                );
                let late = Late::new(&mut retry, &mut recent, &own, &mut pvp, &participant);
                stopping(&mut ws, held, late, &cfg, &participant, &counts).await;
                return;
            }
            if rejoin_again && !paused {
                // The rejoin was refused as RATE_LIMITED: made again after the pause, before
                // anything else (text refused with it goes after it).
                rejoin_again = false;
                if let Some(j) = &join {
                    let Some(again_id) = rejoin(&mut ws, &mut pvp, j, &cfg, &participant).await
                    else {
                        continue 'reconnect;
                    };
                    rejoined = Some(again_id);
                    remember_own(&mut own, (again_id, Kind::SessionJoin));
                    stand_for(
                        again_id,
                        &mut recent,
                        &mut announced,
                        &mut outbox,
                        &mut retry,
                        &counts,
                    );
                    // A server that forgot the participant (a restart behind a proxy that
                    // kept the connection) has no gate for it either.
                    if std::mem::take(&mut forgotten)
                        && !ask_again(
                            &mut ws,
                            &mut gates,
                            &pending,
                            &mut outbox,
                            &cfg,
                            &participant,
                            &counts,
                        )
                        .await
                    {
                        continue 'reconnect;
                    }
                }
            }
            // The outbox waits at the bound as the queue does: chunks a gate released, text
            // refused or unread going again, written on, let the oldest unread go.
            if pending.is_none() && !paused && full_until.is_none() {
                pending = outbox.pop_front();
                if pending.is_some() {
                    retry.ahead = retry.ahead.saturating_sub(1);
                }
            }
            if !queue_open
                && pending.is_none()
                && outbox.is_empty()
                && gates.as_ref().is_none_or(|g| g.is_empty())
            {
                // The participant left, and what waited for approval is settled and sent.
                let late = Late::new(&mut retry, &mut recent, &own, &mut pvp, &participant);
                close_politely(&mut ws, &cfg, &participant, Some((late, &counts))).await;
                return;
            }
            let gate_deadline = gates.as_ref().and_then(super::gate::Gates::next_deadline);
            let next = match pending.take() {
                Some(e) if !paused => Some(e),
                held => {
                    pending = held;
                    tokio::select! {
                    // Frames from the server first: a Close that has already arrived is seen
                    // before another envelope is written into a connection that is going away.
                    biased;
                    // The timers are made only when polled: `select!` evaluates a disabled
                    // branch's expression too, and a `Sleep` made on every pass read the clock
                    // and took a reference to the runtime for each frame read.
                    () = async { if let Some(t) = paused_until { tokio::time::sleep_until(t).await } }, if paused => None,
                    () = async { if let Some(t) = full_until { tokio::time::sleep_until(t.into()).await } }, if full_until.is_some() => None,
                    () = async { if let Some(t) = gate_deadline { tokio::time::sleep_until(t.into()).await } }, if gate_deadline.is_some() => {
                        if let Some(g) = gates.as_mut() {
                            settle(g, &mut outbox, &cfg, &participant, &counts);
                        }
                        None
                    }
                    frame = ws.next() => {
                        alive.heard();
                        match frame {
                            Some(Ok(Message::Text(t))) => {
                                match on_frame(&mut pvp, &participant, t.as_str(), &recent, &own) {
                                    Reaction::Reply(reply) => {
                                        let told = (reply.id(), reply.kind());
                                        if !send_frame(&mut ws, Message::text(reply.into_json()), &cfg, &participant).await {
                                            continue 'reconnect;
                                        }
                                        remember_own(&mut own, told);
                                    }
                                    Reaction::Fatal { code, related } => {
                                        // The server will not take this participant: say so
                                        // loudly, stop, and count what it can no longer send.
                                        // The text the error names was not taken either.
                                        // So is the text written behind a refused join.
                                        let mut refused_now = 0;
                                        if let Some(id) = related {
                                            refused_now += u64::from(refused_text(id, &mut recent, &mut retry, &counts, m, &participant));
                                            refused_now += refused_behind_join(id, &mut recent, &mut retry, &counts, m, &participant);
                                        }
                                        send_frame(&mut ws, Message::Close(None), &cfg, &participant).await;
                                        let lost = give_up_all(&mut rx, &mut pending, &mut outbox, &mut gates, &cfg, &counts).await;
                                        // Counted before it is logged: whoever reads the log finds it counted.
                                        // What it held is lost with its connection, as what its
                                        // queue refuses from now on.
                                        m.participant_queue_refused.inc_by(lost);
                                        m.refused.inc();
                                        retry.let_go();
                                        tracing::error!(%participant, %code, undelivered = lost + refused_now, "PVP server refused this participant; its transcript is not delivered");
                                        return;
                                    }
                                    Reaction::Roles { id, admin } => {
                                        let at = admins.iter().position(|a| **a == *id);
                                        match (at, admin) {
                                            (None, true) => {
                                                if admins.len() == MAX_ADMINS {
                                                    admins.remove(0);
                                                }
                                                admins.push(id.into());
                                            }
                                            (Some(i), false) => {
                                                admins.remove(i);
                                            }
                                            _ => {}
                                        }
                                    }
                                    Reaction::SessionEnd { session: s, .. } if s != session_id => {
                                        tracing::info!(%participant, session = %Printable(&s), "session.end for another PVP session; not acted on");
                                    }
                                    Reaction::SessionEnd { sender, .. }
                                        if !crate::pvp::from_server(&sender) && !admins.iter().any(|a| **a == *sender) =>
                                    {
                                        tracing::warn!(%participant, sender = %Printable(&sender), "session.end from a member not announced as an admin (pvp-spec 6.5); not acted on");
                                    }
                                    Reaction::SessionEnd { sender, reason, final_state, .. } => {
                                        // pvp-spec 6.5: the server takes nothing more for the
                                        // session: what this participant holds and says from
                                        // now on is dropped, and it does not reconnect. Every
                                        // member's connection reads the end; the first to
                                        // says so.
                                        send_frame(&mut ws, Message::Close(None), &cfg, &participant).await;
                                        if ended.end(&route_session) {
                                            m.sessions_ended.inc();
                                            tracing::warn!(session = %session_id, ended_by = %Printable(&sender), reason = %Printable(&reason), %final_state, "PVP session ended by the server; its text is dropped from now on");
                                        }
                                        let lost = give_up_all(&mut rx, &mut pending, &mut outbox, &mut gates, &cfg, &counts).await;
                                        m.session_ended_items.inc_by(lost);
                                        retry.let_go();
                                        tracing::debug!(%participant, undelivered = lost, "PVP session ended; participant stopped");
                                        return;
                                    }
                                    Reaction::Backoff { error, .. } if refusals.contains(&error) => {
                                        // Read again (a server repeating it, or replaying its
                                        // history on a reconnect, pvp-spec 19.1): acted on
                                        // once. A chunk it sent again and held once more would
                                        // go a third time, the server taking it twice.
                                        tracing::debug!(%participant, "RATE_LIMITED or PARTICIPANT_NOT_FOUND read again; already acted on");
                                    }
                                    Reaction::Backoff { related, error, rejoin } => {
                                        if refusals.len() == RECENT {
                                            refusals.pop_front();
                                        }
                                        refusals.push_back(error);
                                        // A server that forgot the participant is paused for
                                        // too: one that keeps forgetting it (refusing the
                                        // rejoin and all after it) is not rejoined at wire
                                        // speed, and the pause doubles while it repeats.
                                        let now = tokio::time::Instant::now();
                                        rate_backoff = rate_pause(rate_backoff, rate_limited_at.map(|t| now - t));
                                        rate_limited_at = Some(now);
                                        paused_until = Some(tokio::time::Instant::now() + rate_backoff);
                                        let code = if rejoin { "PARTICIPANT_NOT_FOUND" } else { "RATE_LIMITED" };
                                        if rejoin {
                                            tracing::warn!(%participant, pause = ?rate_backoff, "PVP server has forgotten this participant (PARTICIPANT_NOT_FOUND); joining again after a pause");
                                        } else {
                                            tracing::warn!(%participant, pause = ?rate_backoff, "PVP server rate-limits this participant; pausing");
                                        }
                                        // Not after its leave (there is no join then): the
                                        // participant has left.
                                        if rejoin && join.is_some() {
                                            if !rejoin_again {
                                                m.rejoined_not_found.inc();
                                                rejoin_again = true;
                                            }
                                            forgotten = true;
                                        }
                                        if related.is_some() && related == rejoined {
                                            // The rejoin after a reconnect (not from the
                                            // queue, so not counted) was not taken.
                                            tracing::info!(%participant, "rejoin refused as {code}; made again after the pause");
                                            rejoined = None;
                                            rejoin_again = true;
                                        } else if let Some(id) = related {
                                            let refused = Refused { pending: &mut pending, outbox: &mut outbox, recent: &mut recent, gates: gates.as_ref(), join: join.as_ref(), announced: announced.as_ref(), rejoin_again, own: &own };
                                            not_taken(id, code, &mut retry, refused, &cfg, &counts, &participant);
                                        }
                                    }
                                    Reaction::Refused(id) => {
                                        refused_text(id, &mut recent, &mut retry, &counts, m, &participant);
                                    }
                                    Reaction::NotTaken(id) => {
                                        // Text held unread past the recent writes; or a
                                        // gate's request the server made no gate for: no
                                        // decision will come, and its chunk is refused now,
                                        // not after its timeout with all behind it waiting.
                                        if !refused_text(id, &mut recent, &mut retry, &counts, m, &participant)
                                            && let Some(g) = gates.as_mut()
                                        {
                                            match g.refuse(&id.to_string()) {
                                                super::gate::Refusal::Refused => {
                                                    tracing::warn!(%participant, %id, "gate.request refused by the PVP server; its chunk is not approved");
                                                    settle(g, &mut outbox, &cfg, &participant, &counts);
                                                }
                                                super::gate::Refusal::Copy => {
                                                    tracing::info!(%participant, %id, "gate.request asked again after a reconnect refused by the PVP server (one that kept the gate refuses the copy); its chunk waits for the gate's decision or its timeout");
                                                }
                                                super::gate::Refusal::Unknown => {}
                                            }
                                        }
                                    }
                                    Reaction::Gate(env) => {
                                        if let Some(g) = gates.as_mut() {
                                            g.on_server(&env);
                                            settle(g, &mut outbox, &cfg, &participant, &counts);
                                        }
                                    }
                                    Reaction::Rejected => {
                                        // A message cut into frames and over the limit in all
                                        // comes cut short (see `SkipOversize`).
                                        if let Some(size) = ws.get_mut().take_skipped() {
                                            tracing::warn!(%participant, size, limit = MAX_MESSAGE, "message from PVP server larger than a connection reads; skipped, not acted on");
                                        }
                                        m.server_frames_rejected.inc();
                                    }
                                    Reaction::None => {}
                                }
                            }
                            Some(Ok(Message::Close(frame))) => {
                                // RFC 6455 5.5.1: answered with a Close, which tungstenite has
                                // queued and writes on a flush.
                                let _ = tokio::time::timeout(cfg.write_timeout, ws.flush()).await;
                                closed_log(&participant, frame.as_ref(), &mut closing_early, opened);
                                if frame.as_ref().is_some_and(|f| f.code == CloseCode::Size)
                                    && let Some(id) = retry.largest_unread()
                                {
                                    // RFC 6455 7.4.1: 1009, a message too big for the server.
                                    // Sent again after the rejoin, it would close every
                                    // connection, the participant's later text queued behind
                                    // it: the largest text not seen read (as large as the one
                                    // refused, at least) is dropped, refused by the server.
                                    refused_text(id, &mut recent, &mut retry, &counts, m, &participant);
                                }
                                continue 'reconnect;
                            }
                            None => {
                                closed_log(&participant, None, &mut closing_early, opened);
                                continue 'reconnect;
                            }
                            Some(Err(err)) => {
                                failed_log(&participant, &err, &mut closing_early, opened);
                                continue 'reconnect;
                            }
                            Some(Ok(Message::Binary(_))) => {
                                // pvp-spec 19.1: one envelope a text frame. Not acted on (a
                                // ping in it goes unanswered): counted, so that can be told.
                                // A message over the limit comes as an empty binary one.
                                if let Some(size) = ws.get_mut().take_skipped() {
                                    tracing::warn!(%participant, size, limit = MAX_MESSAGE, "message from PVP server larger than a connection reads; skipped, not acted on");
                                } else {
                                    tracing::debug!(%participant, "binary frame from PVP server; not acted on");
                                }
                                m.server_frames_rejected.inc();
                            }
                            Some(Ok(Message::Pong(payload))) => {
                                retry.answered(&payload);
                                // Text written since the ping was written is asked about now.
                                if let Some(ping) = retry.ask()
                                    && !send_frame(&mut ws, ping, &cfg, &participant).await
                                {
                                    continue 'reconnect;
                                }
                            }
                            Some(Ok(_)) => {}
                        }
                        None
                    }
                    _ = stop.changed(), if !queue_open || (full_until.is_some() && stop_seen.is_none()) => {
                        // The stop cuts a wait for the pong short ([`STOP_PONG_WAIT`]).
                        if queue_open {
                            continue;
                        }
                        // The gateway stops while chunks of a participant that left still
                        // await approval: they will not get it now.
                        let held = Held::new(&mut pending, &mut outbox, &mut gates, paused_until, join.as_ref().filter(|_| rejoin_again), &mut pvp);
                        let late = Late::new(&mut retry, &mut recent, &own, &mut pvp, &participant);
                        stopping(&mut ws, held, late, &cfg, &participant, &counts).await;
                        return;
                    }
                    e = rx.recv(), if queue_open && !paused && full_until.is_none() && pending.is_none() => match e {
                        Some((queued, e)) => {
                            match gates.as_mut() {
                                // A chunk from the core is held for approval: its request
                                // goes out.
                                Some(g) => {
                                    let out = g.offer(e, &mut pvp, std::time::Instant::now(), now());
                                    if out.as_ref().is_some_and(|o| o.kind() == Kind::GateRequest) {
                                        cfg.metrics.gate_requests.inc();
                                    }
                                    gone(g, &cfg, &counts);
                                    out.map(|out| (queued, out))
                                }
                                None => Some((queued, e)),
                            }
                        }
                        None => {
                            // Queue closed. The participant left: chunks awaiting approval
                            // keep waiting for their decisions, the leave behind them (the
                            // loop ends once they are settled). The gateway stops: they will
                            // not get one now.
                            queue_open = false;
                            if *stop.borrow() || gates.as_ref().is_none_or(|g| g.is_empty()) {
                                let held = Held::new(&mut pending, &mut outbox, &mut gates, paused_until, join.as_ref().filter(|_| rejoin_again), &mut pvp);
                                let late = Late::new(&mut retry, &mut recent, &own, &mut pvp, &participant);
                                stopping(&mut ws, held, late, &cfg, &participant, &counts).await;
                                return;
                            }
                            None
                        }
                    },
                    _ = heartbeat.tick() => {
                        // Bytes of a frame still arriving (a large message over a slow link)
                        // are the server heard from too.
                        if ws.get_mut().take_read() {
                            alive.heard();
                        }
                        match alive.tick() {
                            Tick::Heard => {
                                if let Some(ping) = retry.tick()
                                    && !send_frame(&mut ws, ping, &cfg, &participant).await
                                {
                                    continue 'reconnect;
                                }
                            }
                            Tick::Probe => {
                                // RFC 6455 5.5.2: the server must answer, whatever PVP does.
                                if !send_frame(&mut ws, retry.probe(), &cfg, &participant).await {
                                    continue 'reconnect;
                                }
                            }
                            Tick::Dead => {
                                tracing::warn!(%participant, url = %super::ShownUrl(&cfg.url), "PVP server silent for {:?}, not even answering a WebSocket ping: it is gone; reconnecting", cfg.silence);
                                continue 'reconnect;
                            }
                        }
                        let ping = pvp.heartbeat(now(), participant.clone(), None);
                        let told = (ping.id(), ping.kind());
                        if !send_frame(&mut ws, Message::text(ping.into_json()), &cfg, &participant).await {
                            continue 'reconnect;
                        }
                        remember_own(&mut own, told);
                        None
                    }
                    }
                }
            };
            let Some((queued, e)) = next else { continue };
            let (id, kind) = (e.id(), e.kind());
            if kind == Kind::GateRequest
                && gates
                    .as_ref()
                    .is_none_or(|g| !g.undecided().any(|r| r.id() == id))
            {
                // Its gate was settled (timed out) while the request waited (a pause, a
                // reconnect): nobody is asked about text already dropped.
                continue;
            }
            if kind == Kind::SessionJoin {
                join = Some(e.clone());
            } else if kind == Kind::ParticipantAnnounce
                && let Some(j) = &join
            {
                join = Some(j.join_as_announced(&e));
            }
            // The frame shares the envelope's text only if it is not needed again: a join is
            // kept for rejoins, anything else is resent from `pending` if the write fails.
            // Text has a ping behind it, in the same write, asking whether the server read it
            // (see `Retry`).
            let ask = retry.ask_behind(kind);
            if !send_frames(
                &mut ws,
                Message::text(e.json().to_owned()),
                ask,
                &cfg,
                &participant,
            )
            .await
            {
                // Not known to be delivered: send it again after reconnecting. A join is not:
                // the rejoin made after reconnecting stands for it.
                if kind == Kind::SessionJoin {
                    counts.settled(1);
                    if let Some(spool) = &cfg.spool {
                        spool.done(id);
                    }
                } else {
                    pending = Some((queued, e));
                }
                continue 'reconnect;
            }
            m.send_latency.observe(queued.elapsed().as_secs_f64());
            written(id, kind, &cfg, &counts);
            if kind == Kind::GateRequest
                && let Some(g) = gates.as_mut()
            {
                // Asked again after a refusal: its approvers have `timeout_seconds` from now.
                g.asked(id, std::time::Instant::now());
            }
            if kind == Kind::SessionLeave {
                // Gone: a reconnect before the queue's end is seen (a server closing right
                // after the leave) must not join it again.
                join = None;
                announced = None;
            } else if kind == Kind::ParticipantAnnounce {
                announced = Some(e.clone());
            }
            remember_written(&mut recent, &mut retry, queued, e);
        }
    }
}

/// An envelope written (see [`written`]): a refusal naming it is told ours by `recent`, and
/// text is held by `retry` until seen read.
fn remember_written(
    recent: &mut VecDeque<(ulid::Ulid, Kind)>,
    retry: &mut Retry,
    queued: std::time::Instant,
    e: Envelope,
) {
    if recent.len() == RECENT {
        recent.pop_front();
    }
    recent.push_back((e.id(), e.kind()));
    if e.kind() == Kind::SessionJoin {
        retry.joined = Some((e.id(), retry.written));
    }
    retry.keep(queued, e);
}

/// A connection to the server: TCP (Nagle off), TLS for `wss://`, and the handshake, with
/// [`SkipOversize`] between TLS and tungstenite, so that a server message over
/// [`MAX_MESSAGE`] is skipped rather than failing the connection (see its module).
async fn connect(
    cfg: &WsConfig,
) -> Result<WebSocketStream<SkipOversize<MaybeTlsStream<TcpStream>>>, tungstenite::Error> {
    let mut request = cfg.url.as_str().into_client_request()?;
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    if let Some((_, host)) = authority.as_deref().and_then(|a| a.rsplit_once('@')) {
        // The host follows the last `@` (as `Uri::host` has it); tungstenite cuts at the first,
        // and a password with an `@` of its own went partly into the Host header.
        let value = |v: &str| {
            tungstenite::http::HeaderValue::from_str(v)
                .map_err(|e| tungstenite::Error::HttpFormat(e.into()))
        };
        request
            .headers_mut()
            .insert(tungstenite::http::header::HOST, value(host)?);
        if let Some(auth) = authority.as_deref().and_then(basic_auth) {
            request
                .headers_mut()
                .insert(tungstenite::http::header::AUTHORIZATION, value(&auth)?);
        }
    }
    let uri = request.uri();
    let host = uri
        .host()
        .ok_or(tungstenite::Error::Url(UrlError::NoHostName))?;
    let tls = matches!(
        tungstenite::client::uri_mode(uri)?,
        tungstenite::stream::Mode::Tls
    );
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addrs = tokio::net::lookup_host(format!("{host}:{port}")).await?;
    let tcp = connect_tcp(addrs.collect()).await?;
    // Nagle off: a frame goes out at once. With it on, a frame written right after another
    // (the first context.add behind its join, a pong, a burst) waits for the server's delayed
    // ACK, about 40 ms (measured with `loadtest ws`).
    tcp.set_nodelay(true)?;
    let stream = if tls {
        let config = cfg.tls.clone().ok_or_else(|| {
            tungstenite::Error::Io(std::io::Error::other("wss:// without a TLS configuration"))
        })?;
        // rustls takes an IPv6 address without the URL's brackets.
        let name = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls_pki_types::ServerName::try_from(name)
            .map_err(|_| tungstenite::Error::Tls(tungstenite::error::TlsError::InvalidDnsName))?
            .to_owned();
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(tls_failure)?;
        MaybeTlsStream::Rustls(tls)
    } else {
        MaybeTlsStream::Plain(tcp)
    };
    let stream = SkipOversize::new(stream, MAX_MESSAGE);
    let (ws, _) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(socket_config())).await?;
    Ok(ws)
}

/// How long an attempt to one of a name's addresses goes unanswered before the next is
/// started beside it (RFC 8305 5, "Connection Attempt Delay").
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// TCP to the first of `addrs` that answers: each is tried in order, the next started when the
/// last fails or has gone [`ATTEMPT_DELAY`] unanswered, those started still racing (RFC 8305
/// "Happy Eyeballs"). Tried one after another, each until the kernel gives up on it (as
/// `TcpStream::connect` does), an address that drops the SYN (a blackholed IPv6 route, a node
/// gone behind a name) held every connect until `--connect-timeout-s`, and the next address
/// was never tried. The last failure if none answers.
async fn connect_tcp(addrs: Vec<std::net::SocketAddr>) -> std::io::Result<TcpStream> {
    let mut next = addrs.into_iter();
    let mut racing = futures_util::stream::FuturesUnordered::new();
    racing.extend(next.next().map(TcpStream::connect));
    let mut failed = None;
    while !racing.is_empty() {
        tokio::select! {
            Some(done) = racing.next() => match done {
                Ok(tcp) => return Ok(tcp),
                Err(e) => {
                    failed = Some(e);
                    racing.extend(next.next().map(TcpStream::connect));
                }
            },
            () = tokio::time::sleep(ATTEMPT_DELAY), if next.len() > 0 => {
                racing.extend(next.next().map(TcpStream::connect));
            }
            else => break,
        }
    }
    Err(failed.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

/// A failed connect as the log says it: a refused upgrade (RFC 6455 4.1: any status but 101)
/// with what fixes it, where tungstenite says only the status.
fn connect_failure(e: &tungstenite::Error) -> String {
    let words = match e {
        tungstenite::Error::Http(r) => match r.status().as_u16() {
            401 | 403 => Some(
                "the server refused the upgrade for want of credentials: give them in the \
                 --server URL (ws://user:password@host/) or its query (?token=...), as the \
                 server asks (--token goes in the session.join, after the upgrade)",
            ),
            404 => Some("no WebSocket endpoint at the --server URL's path"),
            _ => None,
        },
        _ => None,
    };
    match words {
        Some(w) => format!("{w}: {e}"),
        None => e.to_string(),
    }
}

/// A failed TLS handshake as the log says it. rustls says some certificate errors in words
/// (a name the certificate does not hold, an expiry), others only by their name; the
/// commonest of those, a certificate no trusted CA signed (a self-signed one, or a private
/// CA's without `--ca-file`), was logged as `invalid peer certificate: UnknownIssuer`, with
/// nothing saying what fixes it.
fn tls_failure(e: std::io::Error) -> std::io::Error {
    use rustls::CertificateError as C;
    let cert = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => c,
        // What a plain HTTP server answers a TLS hello with is no TLS record.
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            return std::io::Error::new(
                e.kind(),
                format!("the server did not answer in TLS (a ws:// server given as wss://?): {e}"),
            );
        }
        _ => return e,
    };
    let words = match cert {
        C::UnknownIssuer => {
            "the server's certificate is not signed by a CA this gateway trusts (self-signed, \
             or a private CA's: give that CA's certificate with --ca-file)"
        }
        C::BadSignature => {
            "the server's certificate does not verify against the CA it names (a --ca-file of \
             another CA under the same name?)"
        }
        C::BadEncoding => "the server's certificate does not parse",
        C::Revoked => "the server's certificate is revoked",
        _ => return e,
    };
    std::io::Error::new(e.kind(), format!("{words}: {e}"))
}

/// The `Authorization` header (HTTP Basic, RFC 7617) for the user information of a URL's
/// `authority` (`user:pw@host`, percent-decoded, RFC 3986 3.2.1), if it has any: a WebSocket
/// client sends the credentials of its URL so (tungstenite drops them from the Host header
/// and sends nothing else, so a server that wanted them answered 401 for ever).
fn basic_auth(authority: &str) -> Option<String> {
    let (userinfo, _) = authority.rsplit_once('@')?;
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(userinfo).collect();
    let decoded = if decoded.contains(&b':') {
        decoded
    } else {
        [decoded.as_slice(), b":"].concat()
    };
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(decoded);
    Some(format!("Basic {encoded}"))
}

/// A participant's connection reads little (pings, errors, gate decisions, and whatever the
/// server echoes) and there may be thousands: tungstenite allocates its read buffer eagerly,
/// 128 KiB by default, and accepts messages of up to 64 MiB, so a faulty server could make
/// every connection hold that much. PVP envelopes are small; a larger one is an error that
/// closes the connection (and it is made again).
fn socket_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        // A message cut at the limit keeps up to 3 bytes more: the rest of a character.
        .max_message_size(Some(MAX_MESSAGE + 3))
        .max_frame_size(Some(MAX_MESSAGE))
        .max_write_buffer_size(MAX_WRITE_BUFFER)
}

/// Envelopes a connection remembers, to name the one a server's `error` relates to. A server
/// answers within moments, but a connection writes what its queue holds before it reads again,
/// so after a burst an answer may name an envelope dozens of writes back; each entry is 24
/// bytes a participant.
const RECENT: usize = 64;

/// Admins a connection remembers, the newest (see `admins` in [`connection`]): a session has a
/// few; past this, the first announced is forgotten, and a `session.end` from it not acted on.
const MAX_ADMINS: usize = 64;

/// Text envelopes (`context.*`) a connection holds after the server was seen to read them,
/// to send again one the server refuses as RATE_LIMITED, each a few hundred bytes a
/// participant.
const HELD: usize = 8;

/// How long a text envelope the server read is held at most: a server answers a write within
/// moments (held longer, a participant speaking every 2 s held 4 KiB more; `loadtest ws`).
const HOLD_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Text envelopes a connection holds at most written and not yet seen read: a server that
/// answers no ping (RFC 6455 5.5.2 says it must) does not grow the connection past this; the
/// oldest is then let go, not to be sent again. 128 covers a participant speaking every
/// second through `--server-silence-s`'s 90 s.
const UNREAD: usize = 128;

/// How long a connection holding [`UNREAD`] text not yet seen read, a ping out asking about
/// it, waits for the pong before it writes more (and so lets the oldest go, marked done in the
/// journal though not seen read). A server answers a ping within a round trip; one that does
/// not answer in this long is taken for one that answers none (RFC 6455 5.5.2 says it must),
/// and the connection goes on as before, without waiting again until a pong comes. Without
/// the wait, a burst past [`UNREAD`] (a participant's backlog after an outage, a restart's
/// resend) let text go that the server had not read: at-least-once broken for it, by a
/// connection lost before the pong (review bb).
const UNREAD_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// At a stop, the wait for the pong at [`UNREAD`] is this long at most, within the stop's
/// grace (5 s): a server answers within a round trip; one that does not, the rest of the
/// queue is left undelivered in the journal ([`hold_back_queue`]) rather than written.
const STOP_PONG_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A text envelope written: when, when it was queued, and its number among the connection's
/// text writes.
struct Kept {
    written: std::time::Instant,
    queued: std::time::Instant,
    n: u64,
    e: Envelope,
}

/// The text envelopes a connection wrote that it may have to send again: each until a pong
/// shows the server read it, then while among the last [`HELD`] written in the last
/// [`HOLD_FOR`] (a RATE_LIMITED refusal comes after the read); and how many refused ones wait
/// at the front of the outbox to go again, so that several go in the order they were first
/// written.
///
/// PVP has no acknowledgement, but WebSocket has one that serves: a server answers a ping
/// with a pong carrying the ping's payload (RFC 6455 5.5.2-5.5.3) and reads a connection's
/// frames in order, so the pong to a ping written after a text shows the text was read. A
/// connection pings after writing text, one such ping out at a time, its payload this
/// participant's `token` and the count of text written before it; what is left unread when the
/// connection is lost (left for silence, a failed write, a reset, a close) goes again after
/// the rejoin ([`Retry::unread`]). It arrives twice only if the server read it and the
/// connection was lost before the pong came back: a round trip's window.
///
/// With `--spool`, text is marked done in the journal when it is seen read (or let go), not
/// when written: a kill while a hung server holds it unread leaves it undelivered in the
/// journal, and the next start sends it.
#[derive(Default)]
struct Retry {
    held: VecDeque<Kept>,
    /// `--spool`: where text read, or let go, is marked done.
    spool: Option<Arc<super::spool::Spool>>,
    ahead: usize,
    /// Text envelopes written so far, on every connection: the next one's number.
    written: u64,
    /// Text numbered below this was read by the server (or given up on at a reconnect).
    read: u64,
    /// A ping asking about written text is out and not answered.
    asking: bool,
    /// Heartbeat ticks the ping has been out at ([`Retry::tick`]).
    ticks_out: u8,
    /// A wait for a pong at [`UNREAD`] ran out ([`Retry::full_until`]); cleared by a pong and
    /// by the connection's loss ([`Retry::unread`]).
    pongless: bool,
    /// The last join (or rejoin) written, and the number the next text written after it took
    /// ([`Retry::written`]): the text behind it, should the server refuse it after it left
    /// the [`RECENT`] writes remembered ([`refused_behind_join`]).
    joined: Option<(ulid::Ulid, u64)>,
    /// The first 8 bytes of this participant's ping payloads: a pong a server sends unasked
    /// (RFC 6455 5.5.3 allows one) is not taken for an answer.
    token: u64,
}

impl Retry {
    fn new(token: u64, spool: Option<Arc<super::spool::Spool>>) -> Self {
        Retry {
            token,
            spool,
            ..Retry::default()
        }
    }

    /// Text the journal may mark done: read by the server, or given up on.
    fn done(&self, e: &Envelope) {
        if let Some(spool) = &self.spool {
            spool.done(e.id());
        }
    }

    /// `e` was written: held if it is text.
    fn keep(&mut self, queued: std::time::Instant, e: Envelope) {
        let now = std::time::Instant::now();
        if e.kind().is_text() {
            self.held.push_back(Kept {
                written: now,
                queued,
                n: self.written,
                e,
            });
            self.written += 1;
        }
        self.expire(now);
    }

    /// Lets go text read and written more than [`HOLD_FOR`] before `now` or before the last
    /// [`HELD`], and unread text past [`UNREAD`]. The read are the oldest.
    fn expire(&mut self, now: std::time::Instant) {
        while let Some(k) = self.held.front() {
            let read = k.n < self.read;
            let go = if read {
                self.held.len() > HELD || now.duration_since(k.written) > HOLD_FOR
            } else {
                self.held.len() > UNREAD
            };
            if !go {
                break;
            }
            if let Some(k) = self.held.pop_front()
                && !read
            {
                // Not to be sent again: a restart must not either.
                self.done(&k.e);
            }
        }
    }

    /// Until when the connection waits before writing more text: it holds [`UNREAD`] text not
    /// seen read and asks about it, the oldest written less than [`UNREAD_WAIT`] ago. A wait
    /// that ran out marks the server as one that answers no ping: no more waits until a pong.
    fn full_until(&mut self) -> Option<std::time::Instant> {
        if self.pongless || !self.at_unread_bound() {
            return None;
        }
        let oldest = self.held.iter().find(|k| k.n >= self.read)?;
        let until = oldest.written + UNREAD_WAIT;
        self.pongless = until <= std::time::Instant::now();
        (!self.pongless).then_some(until)
    }

    /// Whether the connection holds [`UNREAD`] text not seen read, a ping out asking about it:
    /// text written now would let the oldest go.
    fn at_unread_bound(&self) -> bool {
        self.asking && self.written.saturating_sub(self.read) >= UNREAD as u64
    }

    /// A ping's payload: the token and `n`, the count of text written before the ping.
    fn payload_at(&self, n: u64) -> tokio_tungstenite::tungstenite::Bytes {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&self.token.to_be_bytes());
        p[8..].copy_from_slice(&n.to_be_bytes());
        tokio_tungstenite::tungstenite::Bytes::copy_from_slice(&p)
    }

    /// After a pong: the ping that asks whether the server read the text written since the
    /// answered one, unless one is out already or all of it was read.
    fn ask(&mut self) -> Option<Message> {
        if self.asking {
            return None;
        }
        self.ask_all()
    }

    /// The ping to write behind an envelope of `kind` about to be written, asking whether the
    /// server read it, if it is text and no ping is out already.
    fn ask_behind(&mut self, kind: Kind) -> Option<Message> {
        if !kind.is_text() || self.asking {
            return None;
        }
        self.asking = true;
        Some(Message::Ping(self.payload_at(self.written + 1)))
    }

    /// A ping asking whether the server read all the text written, if some is not known
    /// read (the last before a close).
    fn ask_all(&mut self) -> Option<Message> {
        if self.read >= self.written {
            return None;
        }
        self.asking = true;
        Some(Message::Ping(self.payload_at(self.written)))
    }

    /// The connection of a participant that has left (its leave written) closes with text the
    /// server was not seen to read: it is not sent again now (there is no join after the
    /// leave), but counted as dropped rather than sent and, with `--spool`, undelivered again
    /// in the journal, in its place, so the next start sends it (its participant rejoining
    /// first).
    fn give_up_unread(
        &mut self,
        recent: &mut VecDeque<(ulid::Ulid, Kind)>,
        cfg: &WsConfig,
        counts: &Counts,
        participant: &str,
    ) {
        let n = self.unread(recent, cfg, counts).len() as u64;
        if n > 0 {
            counts.settled(n);
            counts.given_up.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(%participant, texts = n, spool = cfg.spool.is_some(), "the participant left and its connection closed before the PVP server was seen to read its last text: not sent again now (with --spool, the next start sends it); dropped");
        }
    }

    /// A heartbeat tick at which the server was heard from: a ping about text that has been
    /// out since the tick before, unanswered (a pong a server dropped, against RFC 6455
    /// 5.5.2), is made again; one lost pong stopped the asking for the connection's life, and
    /// a later loss sent up to [`UNREAD`] envelopes the server had read again (review ai).
    fn tick(&mut self) -> Option<Message> {
        if !self.asking {
            self.ticks_out = 0;
            return None;
        }
        self.ticks_out += 1;
        if self.ticks_out < 2 {
            return None;
        }
        self.asking = false;
        self.ticks_out = 0;
        self.ask()
    }

    /// A ping probing a silent server: answered, it tells the text written before it read
    /// too.
    fn probe(&mut self) -> Message {
        self.ticks_out = 0;
        if self.read < self.written {
            self.asking = true;
        }
        Message::Ping(self.payload_at(self.written))
    }

    /// A pong: if it answers one of this participant's pings, the text written before that
    /// ping was read.
    fn answered(&mut self, payload: &[u8]) {
        let Ok(p) = <[u8; 16]>::try_from(payload) else {
            return;
        };
        let (token, n) = p.split_at(8);
        let n = u64::from_be_bytes(n.try_into().unwrap_or_default());
        if token != self.token.to_be_bytes() || n > self.written {
            return;
        }
        self.seen_read(n);
        self.asking = false;
        self.pongless = false;
        self.ticks_out = 0;
        self.expire(std::time::Instant::now());
    }

    /// The text numbered below `n` was read: marked done in the journal.
    fn seen_read(&mut self, n: u64) {
        for k in self.held.iter().filter(|k| k.n >= self.read && k.n < n) {
            self.done(&k.e);
        }
        self.read = self.read.max(n);
    }

    /// The connection ends for good (the server refused the participant or ended the
    /// session): text not seen read is not sent again, by this process or, marked done in the
    /// journal, the next.
    fn let_go(&mut self) {
        self.seen_read(self.written);
        self.held.clear();
    }

    /// The largest text held that the server was not seen to read.
    fn largest_unread(&self) -> Option<ulid::Ulid> {
        self.held
            .iter()
            .filter(|k| k.n >= self.read)
            .max_by_key(|k| k.e.json().len())
            .map(|k| k.e.id())
    }

    /// The server refused the written text `id` for good: no longer held, and marked done
    /// in the journal if it was not already (read). Its kind, if it was held.
    fn refused(&mut self, id: ulid::Ulid) -> Option<Kind> {
        let i = self.held.iter().position(|k| k.e.id() == id)?;
        let k = self.held.remove(i)?;
        if k.n >= self.read {
            self.done(&k.e);
        }
        Some(k.e.kind())
    }

    /// The connection was lost: the text written into it that the server was not seen to
    /// read, oldest first, taken back as by [`Retry::take_back`] and off the settled count,
    /// to go again after the rejoin ([`Retry::put_back`]).
    fn unread(
        &mut self,
        recent: &mut VecDeque<(ulid::Ulid, Kind)>,
        cfg: &WsConfig,
        counts: &Counts,
    ) -> Vec<(std::time::Instant, Envelope)> {
        self.asking = false;
        // The next connection waits for its own pong at [`UNREAD`]: one that got none (a
        // server hung, then lost) says nothing of it, and writing on let its backlog go.
        self.pongless = false;
        let first = self
            .held
            .iter()
            .position(|k| k.n >= self.read)
            .unwrap_or(self.held.len());
        self.read = self.written;
        let unread: Vec<_> = self.held.drain(first..).map(|k| (k.queued, k.e)).collect();
        for (_, e) in &unread {
            let id = e.id();
            recent.retain(|(r, _)| *r != id);
            if let Some(spool) = &cfg.spool {
                spool.again(e);
            }
        }
        let n = unread.len() as u64;
        counts.sent.fetch_sub(n, Ordering::Relaxed);
        counts.settled.fetch_sub(n, Ordering::Relaxed);
        unread
    }

    /// Text taken back by [`Retry::unread`] goes first, ahead of what the participant has not
    /// sent yet, each before any refused text queued after it that waits to go again
    /// (`ahead`); `pending` goes back among them by when it was queued if it is text (a
    /// refused text whose write again failed was said before the unread text written after
    /// it), behind them if not (a leave).
    fn put_back(
        &mut self,
        unread: Vec<(std::time::Instant, Envelope)>,
        pending: &mut Option<(std::time::Instant, Envelope)>,
        outbox: &mut VecDeque<(std::time::Instant, Envelope)>,
    ) {
        if let Some(p) = pending.take() {
            if p.1.kind().is_text() {
                self.in_order(p, outbox);
            } else {
                outbox.insert(self.ahead.min(outbox.len()), p);
            }
        }
        for u in unread {
            self.in_order(u, outbox);
        }
    }

    /// `text` goes among those that go first (`ahead`), before any queued after it.
    fn in_order(
        &mut self,
        text: (std::time::Instant, Envelope),
        outbox: &mut VecDeque<(std::time::Instant, Envelope)>,
    ) {
        let end = self.ahead.min(outbox.len());
        let at = outbox
            .iter()
            .take(end)
            .position(|(q, w)| w.kind().is_text() && *q > text.0)
            .unwrap_or(end);
        outbox.insert(at, text);
        self.ahead += 1;
    }

    /// The server refused the written text `id` (RATE_LIMITED, PARTICIPANT_NOT_FOUND): if it
    /// is still held, taken back, as not sent: out of `recent` (named again only once written
    /// again), undelivered again in the spool, in its place, and off the `sent` count. The
    /// caller says what becomes of it.
    fn take_back(
        &mut self,
        id: ulid::Ulid,
        recent: &mut VecDeque<(ulid::Ulid, Kind)>,
        cfg: &WsConfig,
        counts: &Counts,
    ) -> Option<(std::time::Instant, Envelope)> {
        self.expire(std::time::Instant::now());
        let i = self.held.iter().position(|k| k.e.id() == id)?;
        let Kept { queued, e, .. } = self.held.remove(i)?;
        recent.retain(|(r, _)| *r != id);
        if let Some(spool) = &cfg.spool {
            spool.again(&e);
        }
        counts.sent.fetch_sub(1, Ordering::Relaxed);
        Some((queued, e))
    }
}

/// What a connection holds that a refused write goes back among.
struct Refused<'a> {
    pending: &'a mut Option<(std::time::Instant, Envelope)>,
    outbox: &'a mut VecDeque<(std::time::Instant, Envelope)>,
    recent: &'a mut VecDeque<(ulid::Ulid, Kind)>,
    /// The gates whose requests a refusal may name.
    gates: Option<&'a super::gate::Gates>,
    /// The participant's join as written (its id), to send again if it is refused.
    join: Option<&'a Envelope>,
    /// The last announce written since the last (re)join, to send again if it is refused.
    announced: Option<&'a Envelope>,
    /// A refused rejoin is to be made again after the pause (it carries the name announced).
    rejoin_again: bool,
    /// The heartbeats, pongs and rejoins last written.
    own: &'a VecDeque<(ulid::Ulid, Kind)>,
}

impl Refused<'_> {
    /// `refused` goes again after the pause, ahead of what waits but behind what was refused
    /// before it (`retry.ahead`); `pending`, taken after it, goes back behind it.
    fn send_again(&mut self, retry: &mut Retry, refused: (std::time::Instant, Envelope)) {
        if let Some(p) = self.pending.take() {
            self.outbox.insert(retry.ahead.min(self.outbox.len()), p);
        }
        self.outbox
            .insert(retry.ahead.min(self.outbox.len()), refused);
        retry.ahead += 1;
    }
}

/// Heartbeats, pongs and rejoins a connection remembers writing (see [`Refused::own`]).
const OWN: usize = 4;

fn remember_own(own: &mut VecDeque<(ulid::Ulid, Kind)>, told: (ulid::Ulid, Kind)) {
    if own.len() == OWN {
        own.pop_front();
    }
    own.push_back(told);
}

/// A rejoin was written: the joins written before it stand for nothing more, and a refusal of
/// one (replayed, pvp-spec 19.1) does not send it again. A join or an announce refused and
/// waiting in the outbox to go again: the rejoin (under the name last announced) stands for it
/// (settled, as one whose write failed). An announce not yet written (released by a gate)
/// still goes. The rejoin, `rejoin`, takes the joins' place among the recent writes: a
/// refusal of it tells the text written behind it ([`refused_behind_join`]).
fn stand_for(
    rejoin: ulid::Ulid,
    recent: &mut VecDeque<(ulid::Ulid, Kind)>,
    announced: &mut Option<Envelope>,
    outbox: &mut VecDeque<(std::time::Instant, Envelope)>,
    retry: &mut Retry,
    counts: &Counts,
) {
    recent.retain(|(_, k)| *k != Kind::SessionJoin);
    if recent.len() == RECENT {
        recent.pop_front();
    }
    recent.push_back((rejoin, Kind::SessionJoin));
    retry.joined = Some((rejoin, retry.written));
    let stale = announced.take().map(|a| a.id());
    let mut i = 0;
    while i < outbox.len() {
        let (kind, id) = (outbox[i].1.kind(), outbox[i].1.id());
        if kind == Kind::SessionJoin || (kind == Kind::ParticipantAnnounce && Some(id) == stale) {
            outbox.remove(i);
            if i < retry.ahead {
                retry.ahead -= 1;
            }
            counts.settled(1);
        } else {
            i += 1;
        }
    }
}

/// The requests of the chunks held for approval written again after a rejoin, to a server
/// that may have no gate for them. One whose request was never written is still `pending`,
/// and goes out from there; so does one refused and waiting in the outbox to be asked again.
/// Gates that expired meanwhile are settled first, not asked about. False: a write failed
/// (reconnect).
async fn ask_again<S>(
    ws: &mut S,
    gates: &mut Option<super::gate::Gates>,
    pending: &Option<(std::time::Instant, Envelope)>,
    outbox: &mut VecDeque<(std::time::Instant, Envelope)>,
    cfg: &WsConfig,
    participant: &str,
    counts: &Counts,
) -> bool
where
    S: futures_util::Sink<Message> + Unpin,
    S::Error: std::fmt::Display,
{
    if let Some(g) = gates.as_mut() {
        settle(g, outbox, cfg, participant, counts);
    }
    let unsent: Vec<ulid::Ulid> = pending
        .iter()
        .chain(outbox.iter())
        .filter(|(_, e)| e.kind() == Kind::GateRequest)
        .map(|(_, e)| e.id())
        .collect();
    let again: Vec<(ulid::Ulid, String)> = gates
        .iter()
        .flat_map(super::gate::Gates::undecided)
        .filter(|r| !unsent.contains(&r.id()))
        .map(|r| (r.id(), r.json().to_owned()))
        .collect();
    for (id, request) in again {
        if !send_frame(ws, Message::text(request), cfg, participant).await {
            return false;
        }
        // Its approvers have `timeout_seconds` from now.
        if let Some(g) = gates.as_mut() {
            g.asked_again(id, std::time::Instant::now());
        }
    }
    true
}

/// The server refused the written envelope `id` as RATE_LIMITED, or as PARTICIPANT_NOT_FOUND
/// (`code`; pvp-spec 17: an error for a rejected operation): it was not taken. Text still
/// held goes again after the pause, ahead of all the participant has not sent yet (after the
/// rejoin, for PARTICIPANT_NOT_FOUND); until then it is neither sent nor settled, and in the
/// spool undelivered again, in its place. Text no longer held is lost: counted as dropped
/// (it stays done in the spool: a restart would send it after what came later) and logged.
/// The participant's join goes again after the pause too (it is not in the session without
/// it) unless a rejoin stands for it, and so does a gate's request still undecided (the
/// server made no gate: no decision would ever come, and the chunk would time out unasked),
/// and the participant's last `participant.announce` (its new name), unless a later announce
/// or a rejoin carries the name by then. Anything else refused (a heartbeat, a pong) is not
/// sent again.
fn not_taken(
    id: ulid::Ulid,
    code: &'static str,
    retry: &mut Retry,
    mut at: Refused<'_>,
    cfg: &WsConfig,
    counts: &Counts,
    participant: &str,
) {
    // Held only for HOLD_FOR: one a participant wrote before falling silent is not sent again
    // on a refusal that comes later (README "Delivery to a PVP server").
    if let Some((queued, e)) = retry.take_back(id, at.recent, cfg, counts) {
        counts.settled.fetch_sub(1, Ordering::Relaxed);
        if code == "RATE_LIMITED" {
            cfg.metrics.rate_limited_resent.inc();
        }
        tracing::info!(%participant, %id, kind = %e.kind(), "refused as {code}; sent again after the pause");
        at.send_again(retry, (queued, e));
    } else if let Some(j) = at.join.filter(|j| j.id() == id)
        && at
            .recent
            .iter()
            .any(|&(r, k)| r == id && k == Kind::SessionJoin)
    {
        // The join refused: the participant is not in the session, and what it sends is
        // without one (pvp-spec 6.3). It goes again after the pause, ahead of everything not
        // yet sent (text refused with it follows it); counted as sent and settled once written
        // again.
        at.recent.retain(|(r, _)| *r != id);
        if at.rejoin_again {
            // A rejoin goes after the pause, and stands for it.
            tracing::info!(%participant, %id, "session.join refused as {code}; the rejoin after the pause stands for it");
            return;
        }
        counts.sent.fetch_sub(1, Ordering::Relaxed);
        counts.settled.fetch_sub(1, Ordering::Relaxed);
        tracing::info!(%participant, %id, "session.join refused as {code}; sent again after the pause");
        at.send_again(retry, (std::time::Instant::now(), j.clone()));
    } else if let Some(request) = at
        .gates
        .and_then(|g| g.undecided().find(|r| r.id() == id))
        .cloned()
    {
        // A gate's request refused: the server made no gate, and no decision will come for
        // it. Asked again after the pause, ahead of what waits (it is sent only while its gate
        // is still undecided). Never counted as sent (`written`).
        at.recent.retain(|(r, _)| *r != id);
        tracing::info!(%participant, %id, "gate.request refused as {code}; asked again after the pause");
        at.send_again(retry, (std::time::Instant::now(), request));
    } else if let Some(a) = at.announced.filter(|a| a.id() == id)
        && at
            .recent
            .iter()
            .any(|&(r, k)| r == id && k == Kind::ParticipantAnnounce)
    {
        // The participant's new name refused: the server keeps the old one. It goes again
        // after the pause, in its place (ahead of what was not taken after it), unless what
        // waits to go already carries the name (a later announce, a join or a rejoin);
        // counted as sent once written again.
        at.recent.retain(|(r, _)| *r != id);
        counts.sent.fetch_sub(1, Ordering::Relaxed);
        let superseded =
            at.rejoin_again
                || at.pending.iter().chain(at.outbox.iter()).any(|(_, e)| {
                    matches!(e.kind(), Kind::ParticipantAnnounce | Kind::SessionJoin)
                });
        if superseded {
            tracing::info!(%participant, %id, "participant.announce refused as {code}; what goes after the pause carries its name");
            return;
        }
        counts.settled.fetch_sub(1, Ordering::Relaxed);
        tracing::info!(%participant, %id, "participant.announce refused as {code}; sent again after the pause");
        at.send_again(retry, (std::time::Instant::now(), a.clone()));
    } else if refused_unheld(id, code, at.recent, cfg, counts, participant) {
        // Text no longer held: dropped (counted and logged there).
    } else if let Some(&(_, kind)) = at.own.iter().find(|(r, _)| *r == id) {
        // A heartbeat or a pong (nothing lost; the next goes at its time), or a rejoin a later
        // one stands for.
        tracing::info!(%participant, %id, %kind, "refused as {code}; not sent again");
    } else if let Some(&(_, kind)) = at.recent.iter().find(|(r, _)| *r == id) {
        // A leave, or an announce a later one (or a rejoin) stands for.
        tracing::info!(%participant, %id, %kind, "refused as {code}; not sent again");
    } else {
        tracing::warn!(%participant, %id, "refused as {code} an envelope not among the last {RECENT} written: if it was text, it is lost (not counted)");
    }
}

/// Text `id` among the connection's `recent` writes, refused as `code` (RATE_LIMITED,
/// PARTICIPANT_NOT_FOUND) when no longer held to be sent again: counted as dropped rather than
/// sent, and as refused by the server, once (the same refusal read again, a server replaying
/// its history on a reconnect, pvp-spec 19.1, finds it no longer among the recent ones). It
/// stays done in the spool: a restart would send it after what came later. False if `id` is
/// no such text.
fn refused_unheld(
    id: ulid::Ulid,
    code: &str,
    recent: &mut VecDeque<(ulid::Ulid, Kind)>,
    cfg: &WsConfig,
    counts: &Counts,
    participant: &str,
) -> bool {
    let Some(&(_, kind)) = recent.iter().find(|(r, _)| *r == id) else {
        return false;
    };
    if !kind.is_text() {
        return false;
    }
    recent.retain(|(r, _)| *r != id);
    counts.sent.fetch_sub(1, Ordering::Relaxed);
    counts.given_up.fetch_add(1, Ordering::Relaxed);
    cfg.metrics.server_refused_items.inc();
    tracing::warn!(%participant, %id, %kind, "refused as {code}, and no longer held to be sent again (written more than {HOLD_FOR:?} ago, or {HELD} newer text envelopes since); dropped");
    true
}

/// Bytes a connection reads at once (tungstenite zero-fills them before each read, so they are
/// all resident).
const READ_BUFFER: usize = 4 * 1024;
/// The largest frame or message a server may send.
const MAX_MESSAGE: usize = 1 << 20;
/// What a connection holds written and not yet taken by the server. tungstenite queues a pong
/// for every ping it reads, into a write buffer unbounded by default: a server that floods
/// pings and stops reading made the gateway hold every pong it owed (96 MiB of pings, 96 MiB
/// more memory). Bounded, a pong that does not fit waits in tungstenite's single place for one
/// (the latest replaces it). Room for the largest envelope the gateway writes (a chunk of
/// `--max-chunk-chars` 1,000,000 characters, at most 6 bytes each in JSON) and more: a frame
/// that does not fit behind the pongs fails the write, and the connection is made again.
const MAX_WRITE_BUFFER: usize = 8 << 20;

/// The participant's join made again (a fresh id, the same content: a server forgets a
/// connection's participant with it, and a refused join is not in the session), written; its
/// id, or `None` if the write failed (the connection is made again).
async fn rejoin<S>(
    write: &mut S,
    pvp: &mut Builder,
    join: &Envelope,
    cfg: &WsConfig,
    participant: &str,
) -> Option<ulid::Ulid>
where
    S: futures_util::Sink<Message> + Unpin,
    S::Error: std::fmt::Display,
{
    let again = pvp.reissue(now(), join);
    let id = again.id();
    send_frame(write, Message::text(again.into_json()), cfg, participant)
        .await
        .then_some(id)
}

/// Gives up on everything a participant that cannot go on holds and will be handed (its queue
/// closed): counted as settled and given up on (dropped, in the sink's totals), and not resent
/// after a restart either. Returns how many.
async fn give_up_all(
    rx: &mut mpsc::Receiver<(std::time::Instant, Envelope)>,
    pending: &mut Option<(std::time::Instant, Envelope)>,
    outbox: &mut VecDeque<(std::time::Instant, Envelope)>,
    gates: &mut Option<super::gate::Gates>,
    cfg: &WsConfig,
    counts: &Counts,
) -> u64 {
    rx.close();
    let mut lost = 0u64;
    let mut give_up = |e: Envelope| {
        lost += 1;
        if let Some(spool) = &cfg.spool {
            spool.done(e.id());
        }
    };
    // A gate's request is not from the queue: not counted.
    for (_, e) in pending.take().into_iter().chain(outbox.drain(..)) {
        if e.kind() != Kind::GateRequest {
            give_up(e);
        }
    }
    for e in gates
        .as_mut()
        .map(super::gate::Gates::abandon)
        .unwrap_or_default()
    {
        give_up(e);
    }
    while let Some((_, e)) = rx.recv().await {
        give_up(e);
    }
    counts.settled(lost);
    counts.given_up.fetch_add(lost, Ordering::Relaxed);
    lost
}

/// At a stop with text unread up to [`UNREAD`] ([`Retry::at_unread_bound`]): what is left in
/// the participant's queue is not written, but counted dropped and, not marked done, left
/// undelivered in the `--spool` journal, so the next start sends it.
async fn hold_back_queue(
    rx: &mut mpsc::Receiver<(std::time::Instant, Envelope)>,
    counts: &Counts,
    participant: &str,
) {
    rx.close();
    let mut n = 0u64;
    while rx.recv().await.is_some() {
        n += 1;
    }
    if n > 0 {
        counts.settled(n);
        counts.given_up.fetch_add(n, Ordering::Relaxed);
        tracing::warn!(%participant, envelopes = n, "stopping with 128 texts the PVP server was not seen to read: the rest of the queue is not written (with --spool, the next start sends it); dropped");
    }
}

/// Writes one frame, or gives up after `--write-timeout-s`: a server that has stopped reading
/// (hung, or gone without a FIN) would otherwise hold the participant until TCP gives up, many
/// minutes later, while its transcript queues and then drops. False: reconnect.
async fn send_frame<S>(write: &mut S, frame: Message, cfg: &WsConfig, participant: &str) -> bool
where
    S: futures_util::Sink<Message> + Unpin,
    S::Error: std::fmt::Display,
{
    send_frames(write, frame, None, cfg, participant).await
}

/// [`send_frame`] of `frame` and, behind it in the same write, `then`.
async fn send_frames<S>(
    write: &mut S,
    frame: Message,
    then: Option<Message>,
    cfg: &WsConfig,
    participant: &str,
) -> bool
where
    S: futures_util::Sink<Message> + Unpin,
    S::Error: std::fmt::Display,
{
    let both = async {
        write.feed(frame).await?;
        if let Some(then) = then {
            write.feed(then).await?;
        }
        write.flush().await
    };
    match tokio::time::timeout(cfg.write_timeout, both).await {
        Ok(Ok(())) => true,
        Ok(Err(err)) => {
            // At debug: a Close written to a connection the server already dropped fails too.
            tracing::debug!(%participant, "PVP write failed: {err}");
            false
        }
        Err(_) => {
            tracing::warn!(%participant, url = %super::ShownUrl(&cfg.url), "PVP server took no frame for {:?}: it has stopped reading; reconnecting", cfg.write_timeout);
            false
        }
    }
}

/// A connection's heartbeat, first one interval after it opens. After a long stretch of
/// sending, it ticks once, not the missed ticks in a burst: each silent tick must give the
/// ping sent at the one before it an interval to be answered ([`Liveness`]).
fn heartbeat_ticks(every: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// Whether the server is still there. A server can vanish without a FIN or a reset (a host
/// gone, a NAT or firewall that forgot the flow) while the gateway has nothing to write, and
/// pvp-spec 8.1's server pings are not something every server sends: each heartbeat interval
/// in which nothing arrived, the connection sends a WebSocket ping, which every server must
/// answer (RFC 6455 5.5.2), and once nothing has arrived for `silence` it gives up. Counted in
/// heartbeat ticks, so a frame costs setting a flag, not a clock read.
struct Liveness {
    /// Something arrived since the last tick.
    heard: bool,
    silent_ticks: u32,
    /// Silent ticks that make the server gone: `silence` in whole heartbeat intervals, at
    /// least two, so a ping always has an interval to be answered in.
    limit: u32,
}

#[derive(Debug, PartialEq, Eq)]
enum Tick {
    /// Something arrived since the last tick.
    Heard,
    /// Nothing since the last tick: ping the server.
    Probe,
    /// Nothing for `silence`: leave the connection.
    Dead,
}

impl Liveness {
    fn new(heartbeat: Duration, silence: Duration) -> Self {
        let intervals = silence.as_nanos().div_ceil(heartbeat.as_nanos().max(1));
        Liveness {
            heard: false,
            silent_ticks: 0,
            limit: u32::try_from(intervals).unwrap_or(u32::MAX).max(2),
        }
    }

    fn heard(&mut self) {
        self.heard = true;
    }

    fn tick(&mut self) -> Tick {
        if std::mem::take(&mut self.heard) {
            self.silent_ticks = 0;
            return Tick::Heard;
        }
        self.silent_ticks += 1;
        if self.silent_ticks >= self.limit {
            Tick::Dead
        } else {
            Tick::Probe
        }
    }
}

/// The next reconnect wait ([`retry_delay`] of the backoff), doubling the backoff for the one
/// after, up to 10 s.
fn next_wait(backoff: &mut Duration, jitter: &mut u128) -> Duration {
    *jitter = splitmix(*jitter);
    let wait = retry_delay(*backoff, *jitter as u64);
    *backoff = (*backoff * 2).min(Duration::from_secs(10));
    wait
}

/// Longest wait between connect attempts once the gateway stops: the shutdown's grace (5 s)
/// leaves room for several, each a chance to deliver what the participant holds.
const STOPPING_RETRY: Duration = Duration::from_millis(500);

/// Waits out a reconnect backoff, cut short when the gateway stops: a server that came back
/// during a wait of up to 10 s would otherwise be tried only after the shutdown's grace, and
/// what the participant holds would be given up although the server could take it. Once
/// stopping, the waits are at most [`STOPPING_RETRY`].
async fn backoff_wait(wait: Duration, stop: &tokio::sync::watch::Receiver<bool>) {
    if *stop.borrow() {
        tokio::time::sleep(wait.min(STOPPING_RETRY)).await;
        return;
    }
    // A copy watches: waiting marks the stop seen, and the connection's own receiver must
    // still see it change (`stop.changed()` ends a participant's wait for approvals).
    let mut watch = stop.clone();
    let sink_gone = tokio::select! {
        () = tokio::time::sleep(wait) => false,
        stopped = watch.wait_for(|s| *s) => stopped.is_err(),
    };
    if sink_gone {
        // The sink is gone without a stop: nothing cuts the wait short.
        tokio::time::sleep(wait).await;
    }
}

/// The wait before reconnect attempt: half the backoff plus up to the other half at random
/// ("equal jitter"). Participants that lost their server together, in a restart, then come
/// back spread over the window instead of all within one instant of each doubling step.
fn retry_delay(backoff: Duration, random: u64) -> Duration {
    let half = backoff / 2;
    let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX - 1);
    half + Duration::from_nanos(random % (spread + 1))
}

/// A frame read from the server.
type WsResult = Result<Message, tokio_tungstenite::tungstenite::Error>;

/// An envelope is written: marked in the spool (text once seen read: the caller hands it to
/// [`Retry::keep`] with [`remember_written`]) and, unless the connection made it itself (a
/// gate's request, as a heartbeat), counted as sent and settled. A gate's request counted as
/// sent made the `stopped` line's `sent` count each gated chunk twice (its request, then its
/// `context.add`), and once a rejected one, whose refusal is counted on its own.
fn written(id: ulid::Ulid, kind: Kind, cfg: &WsConfig, counts: &Counts) {
    // Text is marked once seen read (`Retry`), which holds it from now on.
    if let Some(spool) = cfg.spool.as_ref().filter(|_| !kind.is_text()) {
        spool.done(id);
    }
    if kind != Kind::GateRequest {
        counts.sent.fetch_add(1, Ordering::Relaxed);
        counts.settled(1);
    }
}

/// What a connection whose participant has left (its leave written) still acts on while it
/// closes: a refusal of text it wrote just before. A restart's resend writes the leave right
/// behind the text (README "Delivery to a PVP server"), so a RATE_LIMITED for resent text
/// (what a burst after an outage meets) is always read then: the text is not sent again now
/// (there is no join after the leave), but it was not taken either. It is counted as dropped
/// rather than sent and, with `--spool`, undelivered again in the journal in its place, so the
/// next start sends it (its participant rejoining first). Any other refusal of text is counted
/// as for a connection still open ([`refused_text`]); so is the participant refused
/// (UNAUTHORIZED, SESSION_NOT_FOUND for its join: a journal of a session the server no longer
/// has), after which nothing is journaled again: every later start would be refused the same.
struct Late<'a> {
    retry: &'a mut Retry,
    recent: &'a mut VecDeque<(ulid::Ulid, Kind)>,
    /// The connection's own heartbeats, pongs and rejoins (see [`remember_own`]).
    own: &'a VecDeque<(ulid::Ulid, Kind)>,
    pvp: &'a mut Builder,
    participant: &'a SenderId,
    /// The server refused the participant.
    refused: bool,
}

impl<'a> Late<'a> {
    /// The connection is gone with text the server was not seen to read (see
    /// [`Retry::give_up_unread`]); not for a participant the server refused: every later
    /// start would be refused the same.
    fn unread_lost(&mut self, cfg: &WsConfig, counts: &Counts) {
        if self.refused {
            self.retry.let_go();
        } else {
            self.retry
                .give_up_unread(self.recent, cfg, counts, self.participant);
        }
    }

    fn new(
        retry: &'a mut Retry,
        recent: &'a mut VecDeque<(ulid::Ulid, Kind)>,
        own: &'a VecDeque<(ulid::Ulid, Kind)>,
        pvp: &'a mut Builder,
        participant: &'a SenderId,
    ) -> Self {
        Late {
            retry,
            recent,
            own,
            pvp,
            participant,
            refused: false,
        }
    }

    fn read(&mut self, text: &str, cfg: &WsConfig, counts: &Counts) {
        let participant = self.participant;
        match on_frame(self.pvp, participant, text, self.recent, self.own) {
            Reaction::Fatal { code, related } => {
                if let Some(id) = related {
                    refused_text(
                        id,
                        self.recent,
                        self.retry,
                        counts,
                        &cfg.metrics,
                        participant,
                    );
                    refused_behind_join(
                        id,
                        self.recent,
                        self.retry,
                        counts,
                        &cfg.metrics,
                        participant,
                    );
                }
                if !std::mem::replace(&mut self.refused, true) {
                    cfg.metrics.refused.inc();
                    tracing::error!(%participant, %code, "PVP server refused this participant as it left; what it refuses of its text is not sent again");
                }
            }
            Reaction::Backoff {
                related: Some(id),
                rejoin,
                ..
            } if !self.refused => {
                let Some((_, e)) = self.retry.take_back(id, self.recent, cfg, counts) else {
                    // Text no longer held (read, and let go) is dropped, as while the
                    // connection is open: it was passed over, counted as sent.
                    let code = if rejoin {
                        "PARTICIPANT_NOT_FOUND"
                    } else {
                        "RATE_LIMITED"
                    };
                    refused_unheld(id, code, self.recent, cfg, counts, participant);
                    return;
                };
                counts.given_up.fetch_add(1, Ordering::Relaxed);
                cfg.metrics.server_refused_items.inc();
                tracing::warn!(%participant, %id, kind = %e.kind(), spool = cfg.spool.is_some(), "refused after the participant's leave was written: not sent again now (with --spool, the next start sends it); dropped");
            }
            Reaction::Refused(id) | Reaction::NotTaken(id) => {
                refused_text(
                    id,
                    self.recent,
                    self.retry,
                    counts,
                    &cfg.metrics,
                    participant,
                );
            }
            _ => {}
        }
    }
}

/// What a connection still holds when its queue has closed for the gateway's stop.
struct Held<'a> {
    pending: Option<(std::time::Instant, Envelope)>,
    outbox: &'a mut VecDeque<(std::time::Instant, Envelope)>,
    gates: &'a mut Option<super::gate::Gates>,
    /// The end of a RATE_LIMITED pause (pvp-spec 17) still running.
    paused_until: Option<tokio::time::Instant>,
    /// A rejoin refused as RATE_LIMITED, made again (before anything else) after the pause.
    rejoin: Option<Envelope>,
}

impl<'a> Held<'a> {
    /// What is held; `rejoin`, a join refused (its rejoin) to be made again first, a fresh
    /// one.
    fn new(
        pending: &mut Option<(std::time::Instant, Envelope)>,
        outbox: &'a mut VecDeque<(std::time::Instant, Envelope)>,
        gates: &'a mut Option<super::gate::Gates>,
        paused_until: Option<tokio::time::Instant>,
        rejoin: Option<&Envelope>,
        pvp: &mut Builder,
    ) -> Self {
        Held {
            pending: pending.take(),
            outbox,
            gates,
            paused_until,
            rejoin: rejoin.map(|j| pvp.reissue(now(), j)),
        }
    }
}

/// The end of a connection whose queue has closed: chunks still awaiting approval are dropped
/// (counted, and marked done in the spool: a restart must not offer them again); what is
/// approved and what waited behind it (the leave) goes out, after a rate-limit pause still
/// running (the sink's shutdown grace bounds the wait), and the connection closes.
async fn stopping<S>(
    ws: &mut S,
    held: Held<'_>,
    late: Late<'_>,
    cfg: &WsConfig,
    participant: &str,
    counts: &Counts,
) where
    S: futures_util::Sink<Message> + futures_util::Stream<Item = WsResult> + Unpin,
    S::Error: std::fmt::Display,
{
    let mut send: Vec<(std::time::Instant, Envelope)> = held
        .pending
        .into_iter()
        .chain(held.outbox.drain(..))
        // A request for a chunk that is dropped below asks for nothing.
        .filter(|(_, e)| e.kind() != Kind::GateRequest)
        .collect();
    if let Some(g) = held.gates.as_mut() {
        // Every pending chunk, whatever its deadline (up to a day and 5 s away).
        g.expire();
        let (released, dropped) = g.release(std::time::Instant::now());
        for (e, _) in dropped {
            tracing::warn!(%participant, id = %e.id(), "stopping with a chunk still awaiting approval; dropped");
            refused(&e, cfg);
        }
        gone(g, cfg, counts);
        let now = std::time::Instant::now();
        send.extend(released.into_iter().map(|e| (now, e)));
    }
    if !send.is_empty()
        && let Some(until) = held.paused_until
    {
        tokio::time::sleep_until(until).await;
    }
    let mut late = late;
    if !send.is_empty()
        && let Some(j) = held.rejoin
        && !send_frame(ws, Message::text(j.into_json()), cfg, participant).await
    {
        late.unread_lost(cfg, counts);
        return;
    }
    for (queued, e) in send {
        let (id, kind) = (e.id(), e.kind());
        // Marked in the spool only once written (text once seen read): one that was not is
        // sent again after a restart. After a failed write the connection is gone: the rest is
        // not written either, and counts as lost when the grace ends.
        if !send_frame(ws, Message::text(e.json().to_owned()), cfg, participant).await {
            late.unread_lost(cfg, counts);
            return;
        }
        written(id, kind, cfg, counts);
        remember_written(late.recent, late.retry, queued, e);
    }
    close_politely(ws, cfg, participant, Some((late, counts))).await;
}

/// Everything is sent: a Close, and up to 2 s for the server's, reading what it sent before
/// it (`late`: refusals of text written just before the leave).
async fn close_politely<S>(
    ws: &mut S,
    cfg: &WsConfig,
    participant: &str,
    mut late: Option<(Late<'_>, &Counts)>,
) where
    S: futures_util::Sink<Message> + futures_util::Stream<Item = WsResult> + Unpin,
    S::Error: std::fmt::Display,
{
    // A ping ahead of the Close, if some text is not known read: its pong says it was.
    match late.as_mut().and_then(|(l, _)| l.retry.ask_all()) {
        Some(ping) => {
            send_frames(ws, ping, Some(Message::Close(None)), cfg, participant).await;
        }
        None => {
            send_frame(ws, Message::Close(None), cfg, participant).await;
        }
    }
    // A server that ends the connection within the 2 s (its Close, answering the gateway's,
    // or its end of the TCP connection) read all before it; one that gives no sign (hung), or
    // resets the connection (closed with what was written unread, RFC 9293 3.6.1), may not
    // have. Review aj (session 44) found a server that ends it without a Close seen.
    let all_read = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(m) = ws.next().await {
            match (late.as_mut(), m) {
                // RFC 6455 7.4.1: 1009, the server closed on a message too big for it, not
                // after reading all.
                (_, Ok(Message::Close(f))) => {
                    return !f.is_some_and(|f| f.code == CloseCode::Size);
                }
                (Some((late, counts)), Ok(Message::Text(text))) => late.read(&text, cfg, counts),
                (Some((late, _)), Ok(Message::Pong(payload))) => late.retry.answered(&payload),
                (_, Ok(_)) => {}
                (_, Err(tungstenite::Error::Io(e))) => {
                    return e.kind() != std::io::ErrorKind::ConnectionReset;
                }
                (_, Err(_)) => return true,
            }
        }
        true
    })
    .await
    .unwrap_or(false);
    if let Some((late, counts)) = late.as_mut() {
        if all_read {
            late.retry.seen_read(late.retry.written);
        } else {
            late.unread_lost(cfg, counts);
        }
    }
    tracing::debug!(%participant, "PVP connection closed");
}

/// A gated chunk that will never be sent: counted, and marked done in the spool so that a
/// restart does not offer it again.
fn refused(e: &Envelope, cfg: &WsConfig) {
    refused_id(e.id(), cfg);
}

/// [`refused`] by id.
fn refused_id(id: ulid::Ulid, cfg: &WsConfig) {
    cfg.metrics.gates_refused.inc();
    if let Some(spool) = &cfg.spool {
        spool.done(id);
    }
}

/// Counts what the gates dropped from the core since the last call as settled; the chunks
/// (and corrections) dropped for want of room and the dropped corrections (of a refused
/// chunk) are logged, counted with the refused chunks, and marked done in the spool (a chunk
/// dropped undecided is, where it is handed over); announces a newer one superseded are
/// marked done.
fn gone(g: &mut super::gate::Gates, cfg: &WsConfig, counts: &Counts) {
    counts.settled(g.take_gone());
    cfg.metrics.gates_approved.inc_by(g.take_approved());
    let crowded = g.take_crowded_out();
    if let Some(&first) = crowded.first()
        && let Some(dropped) = g
            .crowding
            .tell(std::time::Instant::now(), crowded.len() as u64)
    {
        tracing::warn!(id = %first, dropped, "transcript chunk or correction offered with the participant's queue bound awaiting approval; dropped (these drops are logged at most every 10 s, with how many since)");
    }
    for id in crowded {
        tracing::debug!(%id, "transcript chunk or correction offered with the participant's queue bound awaiting approval; dropped");
        refused_id(id, cfg);
    }
    for id in g.take_dropped_corrections() {
        tracing::info!(%id, "correction of a refused gated chunk dropped");
        refused_id(id, cfg);
    }
    // A newer name waits in their place: nothing lost, nothing to send after a restart.
    for id in g.take_superseded() {
        tracing::debug!(%id, "participant.announce waiting behind a gate superseded by a newer one");
        if let Some(spool) = &cfg.spool {
            spool.done(id);
        }
    }
}

/// Moves what the gates resolved into the outbox; chunks that will never be sent are logged,
/// counted, and marked in the spool so a restart does not send them either.
fn settle(
    g: &mut super::gate::Gates,
    outbox: &mut VecDeque<(std::time::Instant, Envelope)>,
    cfg: &WsConfig,
    participant: &str,
    counts: &Counts,
) {
    let (send, dropped) = g.release(std::time::Instant::now());
    gone(g, cfg, counts);
    for e in send {
        outbox.push_back((std::time::Instant::now(), e));
    }
    for (e, verdict) in dropped {
        tracing::info!(%participant, id = %e.id(), ?verdict, "transcript chunk not approved; dropped");
        refused(&e, cfg);
    }
}

/// Counts an open connection for as long as it lives.
struct ConnGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What a frame from the server asks of the connection.
enum Reaction {
    None,
    Reply(Envelope),
    /// pvp-spec 17 UNAUTHORIZED or SESSION_NOT_FOUND: this participant cannot go on;
    /// `related`, the envelope it names, if any: text the connection wrote (`context.*`) is
    /// not taken either.
    Fatal {
        code: String,
        related: Option<ulid::Ulid>,
    },
    /// RATE_LIMITED: slow down; `related_to`, the write refused, if it names one; the error
    /// envelope's own id, hashed ([`id_hash`]), to tell it read again. PARTICIPANT_NOT_FOUND
    /// too, with `rejoin`: the server has forgotten the participant (a session it expired, a
    /// restart behind a proxy that kept the connection), which joins again.
    Backoff {
        related: Option<ulid::Ulid>,
        error: u64,
        rejoin: bool,
    },
    /// Any other `error` naming a text envelope (`context.*`) the connection wrote
    /// (CONTEXT_TOO_LARGE, INVALID_MESSAGE, INVALID_STATE, INTERNAL_ERROR, ...): the server
    /// did not take it (pvp-spec 17: an error for every rejected operation).
    Refused(ulid::Ulid),
    /// Any other `error` naming (`related_to`) an envelope not among the recent writes as
    /// text, with a code not otherwise acted on: text held unread past them ([`UNREAD`] >
    /// [`RECENT`]) refused as [`Reaction::Refused`]; a gate's request, if it names one, made no
    /// gate.
    NotTaken(ulid::Ulid),
    /// A gate decision (`gate.approve`, `gate.reject`, `gate.timeout`).
    Gate(crate::pvp::Message),
    /// pvp-spec 6.5 `session.end`, well formed, of `session`: the server takes nothing more.
    SessionEnd {
        session: String,
        sender: String,
        reason: String,
        final_state: String,
    },
    /// A member's roles as the server announced them (`participant.announce`,
    /// `participant.role_change`): whether `id` is an admin, who may end the session.
    Roles {
        id: String,
        admin: bool,
    },
    /// Not acted on, and counted: unparseable (an `error` whose payload is not pvp-spec 17's
    /// too), or of an unknown protocol version.
    Rejected,
}

/// The text envelope `id` (`context.*`) the connection wrote was refused by the server with
/// an `error` (pvp-spec 17): not taken, and not sent again. It moves from sent to dropped and
/// is counted in `server_refused_items`, once: the same error read again (a server replaying
/// its history) no longer finds it among the recent ones nor held. Text the server was not
/// seen to read is held up to [`UNREAD`], twice the [`RECENT`] writes remembered: one
/// refused past those is found held (it was passed over, counted as sent, and sent again
/// after the next reconnect). False if `id` is no such text.
fn refused_text(
    id: ulid::Ulid,
    recent: &mut VecDeque<(ulid::Ulid, Kind)>,
    retry: &mut Retry,
    counts: &Counts,
    m: &crate::metrics::SinkMetrics,
    participant: &str,
) -> bool {
    let kind = match recent.iter().position(|(r, _)| *r == id) {
        Some(i) if recent[i].1.is_text() => {
            retry.refused(id);
            recent.remove(i).map(|(_, k)| k)
        }
        Some(_) => None,
        None => retry.refused(id),
    };
    let Some(kind) = kind else {
        return false;
    };
    counts.sent.fetch_sub(1, Ordering::Relaxed);
    counts.given_up.fetch_add(1, Ordering::Relaxed);
    m.server_refused_items.inc();
    tracing::warn!(%participant, %id, %kind, "refused by the PVP server; dropped");
    true
}

/// The server refused the participant's join `id` (UNAUTHORIZED, SESSION_NOT_FOUND): the
/// participant is not in the session (pvp-spec 6.3), so the text the connection wrote behind
/// the join was not taken either, whatever the server said of it (its errors for that text go
/// unread: the connection stops at the join's). Each is counted as [`refused_text`] counts
/// one; written in the round trip before the refusal came, it was counted as sent. How many.
fn refused_behind_join(
    id: ulid::Ulid,
    recent: &mut VecDeque<(ulid::Ulid, Kind)>,
    retry: &mut Retry,
    counts: &Counts,
    m: &crate::metrics::SinkMetrics,
    participant: &str,
) -> u64 {
    let behind: Vec<ulid::Ulid> = match recent
        .iter()
        .position(|&(r, k)| r == id && k == Kind::SessionJoin)
    {
        Some(at) => recent
            .iter()
            .skip(at + 1)
            .filter(|(_, k)| k.is_text())
            .map(|&(r, _)| r)
            .collect(),
        // Past the last RECENT writes (a backlog written behind it in the round trip): all
        // they hold is behind it, and so is the text held unread since it was written. Only
        // text read and no longer held is not found (counted as sent).
        None => match retry.joined {
            Some((join, from)) if join == id => recent
                .iter()
                .filter(|(_, k)| k.is_text())
                .map(|&(r, _)| r)
                .chain(retry.held.iter().filter(|k| k.n >= from).map(|k| k.e.id()))
                .collect(),
            _ => return 0,
        },
    };
    behind
        .into_iter()
        .filter(|&text| refused_text(text, recent, retry, counts, m, participant))
        .count() as u64
}

/// A server envelope's id as a connection remembers it: identifiers are opaque strings
/// (pvp-spec 5.1; a ULID is only what ids SHOULD be), so any id is told read again, and a
/// 64-bit hash keeps each remembered one at 8 bytes (two of [`RECENT`] alike by chance: about
/// 1 in 2^58).
fn id_hash(id: &str) -> u64 {
    super::hash64(id)
}

/// The one field a connection reads of every frame before deciding whether to read it whole.
/// A server in the reference's style echoes each participant's messages to every member of the
/// session, so with N participants each message reaches the gateway N times, and most frames
/// are other participants' traffic: their type is read (borrowed, nothing allocated) and the
/// rest skipped.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

/// Reacts to one frame from the server: a pong for the server's ping; for an `error`, a log line that
/// names the failed message (`related_to`), and what its code calls for.
fn on_frame(
    pvp: &mut Builder,
    participant: &SenderId,
    text: &str,
    recent: &VecDeque<(ulid::Ulid, Kind)>,
    own: &VecDeque<(ulid::Ulid, Kind)>,
) -> Reaction {
    match serde_json::from_str::<Head>(text) {
        Ok(h)
            if matches!(
                &*h.kind,
                "heartbeat.ping"
                    | "gate.approve"
                    | "gate.reject"
                    | "gate.timeout"
                    | "error"
                    | "session.end"
                    | "participant.announce"
                    | "participant.role_change"
            ) => {}
        Ok(_) => return Reaction::None,
        Err(err) => {
            tracing::debug!(%participant, "unparseable frame from PVP server: {err}");
            return Reaction::Rejected;
        }
    }
    let env: crate::pvp::Message = match serde_json::from_str(text) {
        Ok(e) => e,
        Err(err) => {
            tracing::debug!(%participant, "unparseable frame from PVP server: {err}");
            return Reaction::Rejected;
        }
    };
    // pvp-spec 4.2: "MUST reject envelopes with unknown versions". A ping, a gate decision or
    // an error of another version may mean something else there.
    if env.v != 1 {
        tracing::warn!(%participant, v = env.v, kind = %env.kind, id = %Printable(&env.id), "PVP server frame of an unknown protocol version; not acted on");
        return Reaction::Rejected;
    }
    match env.kind.as_str() {
        // pvp-spec 8.1: the server pings, participants answer. A server relaying session
        // traffic hands a connection other members' pings too, and its own earlier ones (the
        // reference logs every routed message, pings included, and replays that history to
        // each joiner): answered, each was a pong the reference broadcasts to every member, a
        // join into an hour-old session of 100 participants 12,000 of them.
        "heartbeat.ping" if !crate::pvp::from_server(&env.sender) => {
            tracing::trace!(%participant, sender = %Printable(&env.sender), id = %Printable(&env.id), "heartbeat.ping not from the server; not answered");
            Reaction::None
        }
        "heartbeat.ping" => {
            Reaction::Reply(pvp.heartbeat(now(), participant.clone(), Some(&env.id)))
        }
        "gate.approve" | "gate.reject" | "gate.timeout" => Reaction::Gate(env),
        "participant.announce" | "participant.role_change" => {
            #[derive(serde::Deserialize)]
            struct Roles {
                #[serde(alias = "participant")]
                id: String,
                #[serde(alias = "new_roles")]
                roles: Vec<String>,
            }
            match serde_json::from_value::<Roles>(env.payload) {
                Ok(r) => Reaction::Roles {
                    admin: r.roles.iter().any(|r| r == "admin"),
                    id: r.id,
                },
                Err(_) => Reaction::None,
            }
        }
        "session.end" => {
            #[derive(serde::Deserialize)]
            struct End {
                reason: String,
                final_state: String,
            }
            match serde_json::from_value::<End>(env.payload) {
                Ok(end)
                    if matches!(
                        end.final_state.as_str(),
                        "completed" | "aborted" | "timeout"
                    ) =>
                {
                    Reaction::SessionEnd {
                        session: env.session,
                        sender: env.sender,
                        reason: end.reason,
                        final_state: end.final_state,
                    }
                }
                _ => {
                    tracing::warn!(%participant, id = %Printable(&env.id), sender = %Printable(&env.sender), "malformed session.end (pvp-spec 6.5: reason, and final_state completed, aborted or timeout), not acted on");
                    Reaction::Rejected
                }
            }
        }
        "error" => {
            match serde_json::from_value::<ErrorPayload>(env.payload) {
                Ok(err) => {
                    let related_kind = err.related_to.as_deref().and_then(|id| {
                        let id = ulid::Ulid::from_string(id).ok()?;
                        recent
                            .iter()
                            .find(|(i, _)| *i == id)
                            .map(|(_, k)| k.as_str())
                    });
                    // A server relaying session traffic to every member (the reference one
                    // broadcasts what it has no handler for, `error` included) hands this
                    // connection other members' errors, sent under their own ids. Only the
                    // server's word (pvp-spec 4.2: "system") or one under this participant's
                    // own id is a refusal: another member's error, even one naming this
                    // participant's message (an agent throttled by its model provider, or not
                    // allowed to act on a chunk, answering with RATE_LIMITED or UNAUTHORIZED
                    // about it), says nothing of what the server took. Acted on, it sent the
                    // chunk again (the server holding it twice) or stopped the participant.
                    let by_server =
                        crate::pvp::from_server(&env.sender) || env.sender == participant.as_str();
                    if !by_server {
                        tracing::info!(
                            %participant,
                            code = %Printable(&err.code),
                            sender = %Printable(&env.sender),
                            related_to = err.related_to.as_deref().unwrap_or("-"),
                            related_kind = related_kind.unwrap_or("-"),
                            "PVP server error relayed from another member of the session, not acted on: {}",
                            Printable(&err.message)
                        );
                        return Reaction::None;
                    }
                    tracing::warn!(
                        %participant,
                        code = %Printable(&err.code),
                        recoverable = err.recoverable,
                        related_to = err.related_to.as_deref().unwrap_or("-"),
                        related_kind = related_kind.unwrap_or("-"),
                        "PVP server error: {}", Printable(&err.message)
                    );
                    // The text envelope of this connection's the error names, if any.
                    let named = err
                        .related_to
                        .as_deref()
                        .and_then(|id| ulid::Ulid::from_string(id).ok());
                    let text =
                        named.filter(|_| related_kind.is_some_and(|k| k.starts_with("context.")));
                    // A heartbeat or a pong the connection wrote itself (README: "A refused
                    // heartbeat or pong is logged at info level and not sent again"): its
                    // refusal is no refusal of the participant, which a server that takes no
                    // pongs, or one a pong reached before the join, would otherwise stop.
                    let beat = named.is_some_and(|id| {
                        own.iter().any(|&(o, k)| {
                            o == id && matches!(k, Kind::HeartbeatPing | Kind::HeartbeatPong)
                        })
                    });
                    match err.code.as_str() {
                        // The server lost the session after taking this participant's join (a
                        // restart whose connection a proxy kept, a session expired): a server
                        // like the reference one, which makes the session a join names, takes
                        // it back with a rejoin, made as for PARTICIPANT_NOT_FOUND (after a
                        // pause, doubling while it repeats). The join itself refused so, or an
                        // error naming nothing known, stops the participant.
                        "SESSION_NOT_FOUND"
                            if beat
                                || related_kind
                                    .is_some_and(|k| k != Kind::SessionJoin.as_str()) =>
                        {
                            return Reaction::Backoff {
                                related: named,
                                error: id_hash(&env.id),
                                rejoin: true,
                            };
                        }
                        "UNAUTHORIZED" if beat => {
                            tracing::info!(%participant, related_to = err.related_to.as_deref().unwrap_or("-"), "heartbeat refused as UNAUTHORIZED; not sent again");
                            return Reaction::None;
                        }
                        "UNAUTHORIZED" | "SESSION_NOT_FOUND" => {
                            return Reaction::Fatal {
                                code: err.code,
                                related: named,
                            };
                        }
                        code @ ("RATE_LIMITED" | "PARTICIPANT_NOT_FOUND") => {
                            let related = err.related_to.as_deref();
                            return Reaction::Backoff {
                                related: related.and_then(|id| ulid::Ulid::from_string(id).ok()),
                                error: id_hash(&env.id),
                                rejoin: code == "PARTICIPANT_NOT_FOUND",
                            };
                        }
                        _ => {}
                    }
                    if let Some(id) = text {
                        return Reaction::Refused(id);
                    }
                    // Not among the recent writes if it is a gate's request asked again after
                    // a reconnect: the connection's gates tell.
                    if let Some(id) = named {
                        return Reaction::NotTaken(id);
                    }
                }
                Err(e) => {
                    // Not pvp-spec 17's shape: not acted on, and counted as a frame that does
                    // not parse (a refusal the gateway cannot read shows on /metrics).
                    tracing::warn!(%participant, id = %Printable(&env.id), "malformed error envelope, not acted on: {e}");
                    return Reaction::Rejected;
                }
            }
            Reaction::None
        }
        _ => Reaction::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by review az (session 47). A server name with several addresses (its IPv6 and its
    /// IPv4 one, or the nodes behind a name) was connected one address after another, each
    /// until the kernel gave up on it: one that drops the SYN (an IPv6 route blackholed, a
    /// node gone) held every connect until `--connect-timeout-s` failed it, and the next
    /// address, which answers, was never tried: the participant never connected. Here the
    /// first address is a listener whose backlog is full (its SYNs are dropped).
    #[tokio::test]
    async fn a_name_whose_first_address_drops_the_syn_connects_to_the_next() {
        use socket2::{Domain, Socket, Type};
        let full = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        full.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        full.listen(0).unwrap();
        let dropping = full.local_addr().unwrap().as_socket().unwrap();
        // Fills the backlog: the SYNs after it are dropped.
        let _queued = std::net::TcpStream::connect(dropping).unwrap();
        let good = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let answering = good.local_addr().unwrap();
        let tcp = tokio::time::timeout(
            Duration::from_secs(5),
            connect_tcp(vec![dropping, answering]),
        )
        .await
        .expect("connected within the connect timeout")
        .unwrap();
        assert_eq!(tcp.peer_addr().unwrap(), answering);
    }

    /// Every address refusing: the connect fails with the last one's error, at once.
    #[tokio::test]
    async fn a_name_whose_addresses_all_refuse_fails_with_the_error() {
        let refusing = |_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let addrs: Vec<_> = (0..3).map(refusing).collect();
        let err = connect_tcp(addrs).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
        let err = connect_tcp(Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }

    /// A `context.add` as a reference-style server echoes it to every member of the session.
    fn echoed_add(from: &str) -> String {
        let mut b = Builder::new("s1".into(), None, 7);
        let text = "Someone else said this, and it came back to every connection. ".repeat(4);
        let e = b.envelope(
            Time::from_micros(1_700_000_000_000_000),
            from.into(),
            Kind::ContextAdd,
            &serde_json::json!({"key": "k", "content_type": "audio_transcript", "content": text,
                "tags": ["t140", "flush:sentence"], "source": {"type": "t140"}}),
        );
        e.json().to_owned()
    }

    #[test]
    fn frames_for_other_participants_are_skipped_and_ours_answered() {
        let mut pvp = Builder::new("s1".into(), None, 1);
        let me: SenderId = "t140:00000001@127.0.0.1:5000".into();
        let recent = VecDeque::new();
        let other = echoed_add("t140:00000002@127.0.0.1:5002");
        assert!(matches!(
            on_frame(&mut pvp, &me, &other, &recent, &VecDeque::new()),
            Reaction::None
        ));
        let ping = r#"{"v":1,"id":"01HZY3Q6W8V0J5N7Q2R4S6T8V0","ts":"2024-01-01T00:00:00.000Z","session":"s1","sender":"server","type":"heartbeat.ping","payload":{}}"#;
        let Reaction::Reply(pong) = on_frame(&mut pvp, &me, ping, &recent, &VecDeque::new()) else {
            panic!("a ping is answered");
        };
        assert_eq!(pong.kind(), Kind::HeartbeatPong);
        assert!(
            pong.json()
                .contains(r#""ref":"01HZY3Q6W8V0J5N7Q2R4S6T8V0""#),
            "{}",
            pong.json()
        );
        let refused = r#"{"v":1,"id":"01HZY3Q6W8V0J5N7Q2R4S6T8V1","ts":"2024-01-01T00:00:00.000Z","session":"s1","sender":"server","type":"error","payload":{"code":"UNAUTHORIZED","message":"no","recoverable":false}}"#;
        assert!(matches!(
            on_frame(&mut pvp, &me, refused, &recent, &VecDeque::new()),
            Reaction::Fatal { code, .. } if code == "UNAUTHORIZED"
        ));
        assert!(matches!(
            on_frame(&mut pvp, &me, "{\"type\":", &recent, &VecDeque::new()),
            Reaction::Rejected
        ));
    }

    /// Whose error it is: another member's (relayed under its own id, whatever it names) is
    /// not acted on; the server's is, even when it names a message older than the recent ones.
    #[test]
    fn an_error_is_acted_on_only_when_it_is_about_this_participant() {
        let mut pvp = Builder::new("s1".into(), None, 1);
        let me: SenderId = "t140:00000001@127.0.0.1:5000".into();
        let ours = ulid::Ulid::from_string("01HZY3Q6W8V0J5N7Q2R4S6T8V2").unwrap();
        let recent = VecDeque::from([(ours, Kind::SessionJoin)]);
        let error = |sender: &str, related: &str| {
            format!(
                r#"{{"v":1,"id":"01HZY3Q6W8V0J5N7Q2R4S6T8V1","ts":"2024-01-01T00:00:00.000Z","session":"s1","sender":"{sender}","type":"error","payload":{{"code":"UNAUTHORIZED","message":"no","recoverable":false{related}}}}}"#
            )
        };
        let naming = |id: &str| format!(r#","related_to":"{id}""#);
        let other_msg = "01HZY3Q6W8V0J5N7Q2R4S6T8V9";
        let fatal = |r: Reaction| matches!(r, Reaction::Fatal { .. });
        // Another member's, about its own message or naming none.
        assert!(!fatal(on_frame(
            &mut pvp,
            &me,
            &error("agent-1", &naming(other_msg)),
            &recent,
            &VecDeque::new()
        )));
        assert!(!fatal(on_frame(
            &mut pvp,
            &me,
            &error("agent-1", ""),
            &recent,
            &VecDeque::new()
        )));
        // Another member's naming our message (review aa): the member's word, not the
        // server's, which took the message.
        let our_id = ours.to_string();
        assert!(matches!(
            on_frame(
                &mut pvp,
                &me,
                &error("agent-1", &naming(&our_id)),
                &recent,
                &VecDeque::new()
            ),
            Reaction::None
        ));
        // The server's, naming our message, nothing, or a message this connection no longer
        // remembers; and one under our own id.
        assert!(fatal(on_frame(
            &mut pvp,
            &me,
            &error("server", &naming(&our_id)),
            &recent,
            &VecDeque::new()
        )));
        assert!(fatal(on_frame(
            &mut pvp,
            &me,
            &error("system", ""),
            &recent,
            &VecDeque::new()
        )));
        assert!(fatal(on_frame(
            &mut pvp,
            &me,
            &error("system", &naming(other_msg)),
            &recent,
            &VecDeque::new()
        )));
        assert!(fatal(on_frame(
            &mut pvp,
            &me,
            &error(me.as_str(), ""),
            &recent,
            &VecDeque::new()
        )));
    }

    #[test]
    fn a_silent_server_is_pinged_each_interval_and_left_after_the_silence() {
        let hb = Duration::from_secs(30);
        // 90 s of silence is three intervals: two pings, then the connection is left.
        let mut l = Liveness::new(hb, Duration::from_secs(90));
        assert_eq!(l.tick(), Tick::Probe);
        assert_eq!(l.tick(), Tick::Probe);
        assert_eq!(l.tick(), Tick::Dead);
        // Anything heard (a pong, an echo) starts the count again.
        let mut l = Liveness::new(hb, Duration::from_secs(90));
        assert_eq!(l.tick(), Tick::Probe);
        l.heard();
        assert_eq!(l.tick(), Tick::Heard);
        assert_eq!(l.tick(), Tick::Probe);
        assert_eq!(l.tick(), Tick::Probe);
        l.heard();
        l.heard();
        assert_eq!(l.tick(), Tick::Heard);
        assert_eq!(l.tick(), Tick::Probe);
        // A part interval counts as a whole one, and a ping always gets an interval to be
        // answered: never left on the first silent tick.
        assert_eq!(Liveness::new(hb, Duration::from_secs(61)).limit, 3);
        assert_eq!(Liveness::new(hb, Duration::from_secs(1)).limit, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_long_stretch_of_sending_silent_ticks_still_come_an_interval_apart() {
        let every = Duration::from_secs(30);
        let start = tokio::time::Instant::now();
        let mut ticks = heartbeat_ticks(every);
        ticks.tick().await;
        assert_eq!(start.elapsed(), every);
        // The connection was busy writing for four intervals and polled no tick.
        tokio::time::advance(every * 4).await;
        let busy_until = start.elapsed();
        ticks.tick().await;
        assert_eq!(start.elapsed(), busy_until);
        // The next tick is a whole interval later, not at once: a ping sent at the first has
        // time to be answered before the second counts as silent too.
        ticks.tick().await;
        assert_eq!(start.elapsed(), busy_until + every);
    }

    /// The pause doubles while RATE_LIMITED repeats, up to 30 s, and starts small again after
    /// a calm minute: a few rate limits early in a long session do not pause it 30 s for good.
    #[test]
    fn the_rate_limit_pause_doubles_while_it_repeats_and_shrinks_after_a_calm() {
        let s = Duration::from_secs;
        let mut pause = Duration::from_millis(250);
        let mut seen = Vec::new();
        for since in [None, Some(s(1)), Some(s(1)), Some(s(5)), Some(s(59))] {
            pause = rate_pause(pause, since);
            seen.push(pause.as_millis());
        }
        assert_eq!(seen, [500, 1000, 2000, 4000, 8000]);
        for _ in 0..10 {
            pause = rate_pause(pause, Some(s(1)));
        }
        assert_eq!(pause, s(30));
        assert_eq!(rate_pause(pause, Some(s(60))), Duration::from_millis(500));
    }

    #[test]
    fn server_text_is_logged_on_one_line() {
        assert_eq!(
            Printable("bye\n2026 ERROR forged\r\u{1b}[31m").to_string(),
            "bye\\n2026 ERROR forged\\r\\u{1b}[31m"
        );
        assert_eq!(
            Printable("token rejected é").to_string(),
            "token rejected é"
        );
    }

    #[test]
    fn url_credentials_are_basic_authentication() {
        assert_eq!(basic_auth("host:3000"), None);
        assert_eq!(
            basic_auth("user:secret@host:3000").as_deref(),
            Some("Basic dXNlcjpzZWNyZXQ=")
        );
        // RFC 7617's example, its password percent-encoded in the URL.
        assert_eq!(
            basic_auth("Aladdin:open%20sesame@[::1]").as_deref(),
            Some("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
        assert_eq!(basic_auth("u@h").as_deref(), Some("Basic dTo="));
    }

    #[test]
    fn reconnect_waits_spread_over_the_upper_half_of_the_backoff() {
        let backoff = Duration::from_secs(10);
        let mut quarters = [0u32; 2];
        for seed in 0..1_000u64 {
            // Each connection seeds its own generator; their first waits must differ.
            let wait = retry_delay(backoff, splitmix(random_seed() ^ u128::from(seed)) as u64);
            assert!(wait >= backoff / 2 && wait <= backoff, "{wait:?}");
            quarters[usize::from(wait >= backoff * 3 / 4)] += 1;
        }
        // 1,000 connections that failed together: both halves of the window get a share
        // (each is 500 +- 16 in expectation; below 350 is a broken generator).
        assert!(quarters.iter().all(|&n| n > 350), "{quarters:?}");
        assert_eq!(
            retry_delay(Duration::from_millis(100), 0),
            Duration::from_millis(50)
        );
        assert_eq!(
            retry_delay(Duration::from_millis(100), 50_000_000),
            Duration::from_millis(100)
        );
    }

    /// Text `context.add`s from one participant, numbered in their content.
    fn adds(n: usize) -> Vec<Envelope> {
        let mut b = Builder::new("s".into(), None, 3);
        (0..n)
            .map(|i| {
                b.envelope(
                    Time::from_micros(1_700_000_000_000_000),
                    "t140:00000001@127.0.0.1:5000".into(),
                    Kind::ContextAdd,
                    &serde_json::json!({"key": format!("k{i}"), "content_type": "audio_transcript",
                        "content": format!("text {i}")}),
                )
            })
            .collect()
    }

    fn counted(sent: u64) -> Counts {
        Counts {
            sent: Arc::new(AtomicU64::new(sent)),
            settled: Arc::new(AtomicU64::new(sent)),
            given_up: Arc::new(AtomicU64::new(0)),
        }
    }

    fn quiet_config() -> WsConfig {
        WsConfig {
            url: "ws://127.0.0.1:9".into(),
            session: "s".into(),
            heartbeat: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            silence: Duration::from_secs(90),
            queue: 64,
            metrics: crate::metrics::SinkMetrics::default(),
            tls: None,
            spool: None,
            gate: None,
        }
    }

    fn ping_payload(m: Option<Message>) -> Vec<u8> {
        match m {
            Some(Message::Ping(p)) => p.to_vec(),
            other => panic!("a ping, not {other:?}"),
        }
    }

    /// With `--spool`, text is marked done in the journal once a pong shows it read, refused
    /// for good, let go past [`UNREAD`] or at a connection's end for good: not as written, so
    /// a kill before the server read it leaves it for the next start.
    #[test]
    fn text_is_marked_done_in_the_journal_when_seen_read_or_let_go_not_when_written() {
        let dir = std::env::temp_dir().join(format!("pvp-t140-ws-done-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (spool, _) = super::super::spool::Spool::open(
            &dir,
            prometheus_client::metrics::counter::Counter::default(),
        )
        .unwrap();
        let spool = Arc::new(spool);
        let done = || {
            spool.flush();
            let journal = std::fs::read_to_string(dir.join("journal.ndjson")).unwrap();
            let e = adds(4);
            let ids: Vec<usize> = (0..4)
                .filter(|i| journal.contains(&format!("{{\"done\":\"{}\"}}", e[*i].id())))
                .collect();
            ids
        };
        let (e, t0) = (adds(4), std::time::Instant::now());
        let mut r = Retry::new(7, Some(spool.clone()));
        let first = ping_payload(r.ask_behind(Kind::ContextAdd));
        for e in &e {
            spool.added(e);
            r.keep(t0, e.clone());
        }
        assert_eq!(done(), [] as [usize; 0], "written, not seen read");
        r.answered(&first);
        assert_eq!(
            done(),
            [0],
            "the pong answers the ping written behind text 0"
        );
        r.refused(e[2].id());
        assert_eq!(done(), [0, 2], "refused for good");
        r.let_go();
        assert_eq!(done(), [0, 1, 2, 3], "the connection ends for good");
        // Past the bound, the oldest unread is let go (not to be sent again) and marked.
        let mut r = Retry::new(8, Some(spool.clone()));
        let mut b = Builder::new("s".into(), None, 4);
        let more: Vec<_> = (0..=UNREAD)
            .map(|i| {
                b.envelope(
                    Time::from_micros(1_700_000_000_000_000),
                    "t140:00000001@127.0.0.1:5000".into(),
                    Kind::ContextAdd,
                    &serde_json::json!({"key": format!("m{i}"), "content": "more"}),
                )
            })
            .collect();
        for e in &more {
            spool.added(e);
            r.keep(t0, e.clone());
        }
        spool.flush();
        let journal = std::fs::read_to_string(dir.join("journal.ndjson")).unwrap();
        let marked = more
            .iter()
            .map(|e| journal.contains(&format!("{{\"done\":\"{}\"}}", e.id())))
            .collect::<Vec<_>>();
        assert_eq!(marked.iter().filter(|m| **m).count(), 1);
        assert!(marked[0], "the oldest");
        drop((r, spool));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn written_text_is_held_until_a_pong_shows_it_read_and_the_unread_goes_again_in_order() {
        let (cfg, counts) = (quiet_config(), counted(3));
        let e = adds(3);
        let t0 = std::time::Instant::now();
        let mut r = Retry::new(42, None);
        // Written with a ping behind it; the next text without one, one being out.
        let first = ping_payload(r.ask_behind(Kind::ContextAdd));
        r.keep(t0, e[0].clone());
        assert!(
            r.ask_behind(Kind::ContextAdd).is_none(),
            "one ping out at a time"
        );
        r.keep(t0, e[1].clone());
        assert!(r.ask().is_none());
        // A pong that is not the answer to one of ours (another token, a server's unasked
        // one) tells nothing.
        let mut other = first.clone();
        other[0] ^= 1;
        r.answered(&other);
        r.answered(b"");
        assert!(r.ask().is_none());
        // The answer: text 0 was read; text 1, written after the ping, is asked about now.
        r.answered(&first);
        let second = ping_payload(r.ask());
        r.keep(t0, e[2].clone());
        let mut recent: VecDeque<_> = e.iter().map(|e| (e.id(), e.kind())).collect();
        let unread = r.unread(&mut recent, &cfg, &counts);
        let ids: Vec<_> = unread.iter().map(|(_, e)| e.id()).collect();
        assert_eq!(ids, [e[1].id(), e[2].id()]);
        assert_eq!(counts.sent.load(Ordering::Relaxed), 1);
        assert_eq!(counts.settled.load(Ordering::Relaxed), 1);
        assert_eq!(recent, [(e[0].id(), Kind::ContextAdd)]);
        // The lost connection's pong, were it to come, changes nothing; text 0 is still held
        // for a RATE_LIMITED refusal.
        r.answered(&second);
        assert!(r.ask().is_none());
        assert!(r.take_back(e[0].id(), &mut recent, &cfg, &counts).is_some());
    }

    #[test]
    fn unread_text_is_held_past_the_refusal_window_up_to_its_bound() {
        let e = adds(1);
        let mut r = Retry::new(1, None);
        for _ in 0..UNREAD + 3 {
            r.keep(std::time::Instant::now(), e[0].clone());
        }
        r.expire(std::time::Instant::now() + 2 * HOLD_FOR);
        assert_eq!(r.held.len(), UNREAD);
        // Read, it is held only while among the last HELD and within HOLD_FOR.
        let p = ping_payload(Some(r.probe()));
        r.answered(&p);
        assert_eq!(r.held.len(), HELD);
        r.expire(std::time::Instant::now() + 2 * HOLD_FOR);
        assert!(r.held.is_empty(), "{}", r.held.len());
    }

    #[test]
    fn unread_text_goes_before_refused_text_queued_after_it_and_before_what_was_not_sent() {
        let e = adds(4);
        let t0 = std::time::Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut r = Retry::new(1, None);
        // Text 2 was refused and waits to go again (`ahead`); text 3 was never written.
        let mut outbox = VecDeque::from([(at(2), e[2].clone())]);
        r.ahead = 1;
        let mut pending = Some((at(3), e[3].clone()));
        r.put_back(
            vec![(at(0), e[0].clone()), (at(1), e[1].clone())],
            &mut pending,
            &mut outbox,
        );
        let order: Vec<_> = outbox.iter().map(|(_, e)| e.id()).collect();
        assert_eq!(order, e.iter().map(Envelope::id).collect::<Vec<_>>());
        assert_eq!(r.ahead, 4);
        assert!(pending.is_none());
    }

    #[test]
    fn a_ping_unanswered_for_a_heartbeat_interval_is_made_again() {
        let e = adds(2);
        let mut r = Retry::new(5, None);
        let lost = ping_payload(r.ask_behind(Kind::ContextAdd));
        r.keep(std::time::Instant::now(), e[0].clone());
        // Out at one tick: it may have been written just before it.
        assert!(r.tick().is_none());
        r.keep(std::time::Instant::now(), e[1].clone());
        // Out at the next: its pong was lost; asked again, about all written.
        let again = ping_payload(r.tick());
        assert_ne!(again, lost);
        r.answered(&again);
        assert!(r.tick().is_none() && r.ask().is_none(), "all read");
        let (cfg, counts) = (quiet_config(), counted(2));
        assert!(r.unread(&mut VecDeque::new(), &cfg, &counts).is_empty());
    }
}
