//! `--spool DIR`: an append-only journal of what the PVP sink was given and what it wrote, so a
//! gateway killed with SIGKILL resends, on restart, exactly what it had journaled and not yet
//! delivered — and nothing it had.
//!
//! `journal.ndjson` holds one JSON record a line: `{"add":ENVELOPE,"n":ORDER}` when an envelope
//! enters the sink (handed over before any attempt to send it), `{"done":"ID"}` once it is
//! delivered (a join or leave once its frame is written to the socket; text once the server's
//! pong to a ping written behind it shows it read, RFC 6455 5.5.3, as the ws sink's connection
//! asks) or given up on. `ORDER` is the envelope's place, and a restart sends what is
//! undelivered in that order: one refused after it was written is added again with its old
//! order, so it goes before what its participant said since (its leave), whether its first
//! `add` is still in the file or a compaction took it (README, "Delivery to a PVP server"). A
//! journal written before records had an order keeps each envelope where its first record is.
//! A writer thread of its own writes the records with `write(2)` in the order they were handed
//! over, so they survive the process being killed (not a power cut: there is no fsync per
//! record); what it had not yet written when killed is lost with the rest of the process's
//! memory. On start the journal is read, the envelopes without `done` are handed to the sink
//! again (each participant rejoins first and leaves after, since its stream is gone), and the
//! journal starts over with just those, ordered afresh. While running, a journal grown large,
//! or one a write failed on, is rewritten the same way from memory (`COMPACT_AT`), each record
//! with the order it has, with `{"join":ENVELOPE}` records keeping each present participant's
//! join for a rejoin. A frame written in the instant before a kill, before its `done` record,
//! is sent twice, and so is text the server read before a kill that came before its pong: the
//! delivery is at least once, with those windows as the only duplicates.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};

use crate::pvp::{Envelope, Kind, Message, SenderId};

/// A journal this large is rewritten with only what is still needed, if that is at most half
/// of it. Without this the journal grows by every envelope's text for as long as the gateway
/// runs (10,000 participants each saying a sentence every 2 s journal about 2.2 MB a second),
/// until the disk is full, and a restart reads all of it.
const COMPACT_AT: u64 = 64 << 20;
/// What is undelivered is kept in memory for compacting (besides the queues' own copies). Past
/// this much (a long outage with much traffic), compacting stops until the next start and the
/// journal grows as an append-only file, so memory stays bounded.
const LIVE_CAP: u64 = 256 << 20;
/// Records waiting for the journal's writer thread. Past this many (a disk that stalls for
/// seconds under heavy traffic), handing one over waits for the writer: the journal is then
/// what slows the sink down, rather than records being skipped.
const QUEUE: usize = 1 << 16;
/// How long the writer lets records gather after the first of a batch. It bounds how much
/// later than before (when each record was written at once) a record reaches the file, so
/// what a SIGKILL can catch unwritten.
const COALESCE: Duration = Duration::from_millis(1);
/// Orders of the envelopes last written (`done`) that the journal remembers, so one journaled
/// again after it was written ([`Spool::again`]: refused as RATE_LIMITED, which comes within
/// the 5 s a connection holds it, README "Delivery to a PVP server") keeps its place, before
/// what its participant said later (its leave), though a compaction took its first `add`.
/// 65,536 is more than 5 s of 10,000 participants each saying a sentence every 2 s; 2 MiB at
/// most (32 bytes an entry: a ULID is 16-aligned). One found no longer here gets a new order:
/// it goes last unless its first `add` is still in the file ([`read_pending`]), and a restart
/// rejoins before it ([`resend_plan`]).
const PLACES_KEPT: usize = 1 << 16;
/// After a failed write, how long the writer waits before it tries again to rewrite the
/// journal whole from memory (a full disk is not retried on every record).
const REPAIR_EVERY: Duration = Duration::from_secs(1);
/// How long the journal keeps the join of a participant whose leave was written, and how many
/// such joins at most. Text refused after the leave was written ([`Spool::again`], README
/// "Delivery to a PVP server": what a restart's resend meets, its leave right behind its text)
/// comes within the 5 s a connection holds written text; it gets its participant's join back,
/// so a compaction before the next start keeps a join for that start to rejoin with.
const LEFT_KEPT: Duration = Duration::from_secs(30);

/// The journal of the PVP sink. Records are written by a thread of their own, in the order
/// they are handed over (`added` before the frame is sent, `done` once it was delivered), a
/// batch a write(2): the writes, and the stalls a busy disk gives them, stay off the thread
/// that serves the PVP connections. With 10,000 participants that cut what the spool costs
/// that thread by 54-79% (docs/performance.md, section 19).
#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
    /// `DIR/journal.lock`, locked for as long as the spool is open ([`lock`]).
    _lock: Option<File>,
    tx: Option<mpsc::SyncSender<Record>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Records that could not be written (disk full, I/O error): logged loudly, counted.
    write_errors: Counter,
    /// The writer's queue was found full and has not had room since (logged once a stall).
    behind: AtomicBool,
    /// The writer thread was found gone (it ended unasked): logged once, not a line a record.
    gone: AtomicBool,
    /// Lines of the journal the start skipped ([`read_pending`], [`resend_plan`]).
    skipped: u64,
}

/// A participant in a session (the session as the envelope's JSON has it): presence is per
/// session, and one id may be in two (a `[[stream]]` rule's participant in two rooms).
type Who = (Box<str>, SenderId);

/// Whose presence a join or a leave is, or whose name an announce gives; nothing for other
/// envelopes.
fn who(e: &Envelope) -> Option<Who> {
    matches!(
        e.kind(),
        Kind::SessionJoin | Kind::SessionLeave | Kind::ParticipantAnnounce
    )
    .then(|| (e.session_json().into(), e.sender().clone()))
}

/// Whose text (`context.*`) an envelope is, as a hash of its participant ([`who_hash`]): its
/// participant's join is kept while it is undelivered ([`Journal::texts`]). A hash, made
/// without an allocation on the sink's thread, 8 bytes a text kept (two participants alike
/// by chance, about 1 in 2^64, would keep one's join a little longer).
fn text_of(e: &Envelope) -> Option<u64> {
    e.kind()
        .is_text()
        .then(|| who_hash(e.session_json(), e.sender()))
}

/// A participant ([`Who`]) as a hash.
fn who_hash(session: &str, sender: &str) -> u64 {
    super::hash64((session, sender))
}

/// What the sink hands the journal's writer.
#[derive(Debug)]
enum Record {
    /// An envelope about to be sent: its `add` line, made on the sink's thread (the envelope
    /// itself goes on to its connection).
    Add {
        id: ulid::Ulid,
        kind: Kind,
        /// For a join or a leave: whose presence it is; for an announce, whose name.
        who: Option<Who>,
        /// For text, whose ([`text_of`]).
        text_of: Option<u64>,
        line: String,
        /// Journaled again after it was written ([`Spool::again`]): it takes its old order.
        again: bool,
    },
    /// An envelope delivered or given up on ([`Spool::done`]).
    Done(ulid::Ulid),
    /// Answered once everything handed over before it is written.
    Flush(mpsc::Sender<()>),
    /// Tests: the journal's open file is replaced (by `/dev/full`, a disk that is full).
    #[cfg(all(test, any(target_os = "linux", target_os = "android")))]
    Swap(File),
}

/// The open journal, and what a compaction keeps of it: the envelopes not yet written to the
/// server, in order, and the latest join of every participant that has not left, or still has
/// text undelivered (written before its leave, its pong still to come, or refused after the
/// leave): a restart rejoins with it before resending.
#[derive(Debug)]
struct Journal {
    path: PathBuf,
    file: File,
    /// Failed writes, logged at the first and then at most every 10 s.
    write_failures: crate::said::Said<Instant>,
    /// Bytes in the journal file.
    size: u64,
    /// The size a compaction is next tried at: `compact_every`, or more after one failed.
    compact_at: u64,
    /// The journal's threshold ([`COMPACT_AT`]).
    compact_every: u64,
    live_cap: u64,
    /// Order of the next envelope added.
    next: u64,
    /// Undelivered envelopes by order: their `add` records, and for a leave, whose.
    live: BTreeMap<u64, Live>,
    order: HashMap<ulid::Ulid, u64>,
    /// The orders of the envelopes last written, the newest last (see [`PLACES_KEPT`]). Kept
    /// past `live_cap` (it is bounded), so one written before is journaled again in its place.
    written: VecDeque<(ulid::Ulid, u64)>,
    live_bytes: u64,
    /// Each participant's latest join as a `join` record, with the join's order.
    joins: HashMap<Who, (u64, String)>,
    joins_bytes: u64,
    /// Joins of participants whose leave was written in the last [`LEFT_KEPT`] (at most
    /// [`PLACES_KEPT`]), oldest first, for text refused after the leave ([`Journal::add`]).
    left: VecDeque<(Instant, Who, (u64, String))>,
    /// Text journaled again after its participant's leave was written, by order: whose, for
    /// the join put back in `joins` for it ([`Journal::add`]).
    restored: HashMap<u64, Who>,
    /// Per participant with such text: the order of the join put back, and how much of its
    /// text is still undelivered (the join goes again once none is).
    restored_for: HashMap<Who, (u64, usize)>,
    /// Undelivered text (`context.*`) per participant ([`who_hash`]).
    texts: HashMap<u64, usize>,
    /// Participants whose leave was written while some of their text was still undelivered
    /// (written before the leave, its pong still to come, README "Delivery to a PVP server"):
    /// the order of the join kept for that text, until none is undelivered. The leave's mark
    /// dropped it, and a compaction before the pong, then a kill, left the text with no join
    /// for the next start to rejoin with (review an, session 45).
    lingering: HashMap<u64, (Who, u64)>,
    /// Past `live_cap`: compacting stopped for this run (see [`LIVE_CAP`]).
    untracked: bool,
    /// A write failed: the file may lack records or end in part of one. Until the journal is
    /// rewritten whole from memory, when that may next be tried.
    damaged: Option<Instant>,
    /// A write failed: the file may end in part of a record, so the next write starts with a
    /// newline. Appended to that part, a whole record would share its line, and the next start
    /// would skip both.
    torn: bool,
    repair_every: Duration,
}

#[derive(Debug)]
struct Live {
    record: String,
    leave_of: Option<Who>,
    /// Whose text it is ([`text_of`]).
    text_of: Option<u64>,
}

impl Spool {
    /// Opens (creating) `dir/journal.ndjson` and returns the envelopes it had not delivered,
    /// in order, ready to be handed to the sink again. The journal is rewritten to hold only
    /// those, so a crash during the resend loses nothing either. Writes that fail later are
    /// counted in `write_errors`.
    pub fn open(dir: &Path, write_errors: Counter) -> Result<(Spool, Vec<Envelope>), String> {
        Self::open_with(dir, COMPACT_AT, LIVE_CAP, write_errors)
    }

    fn open_with(
        dir: &Path,
        compact_at: u64,
        live_cap: u64,
        write_errors: Counter,
    ) -> Result<(Spool, Vec<Envelope>), String> {
        // An empty path names no directory (a config file's `spool = ""`): taken for one, it
        // was the working directory.
        if dir.as_os_str().is_empty() {
            return Err("--spool: an empty path names no directory".into());
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("--spool {}: {e}", dir.display()))?;
        let lock = lock(dir)?;
        let path = dir.join("journal.ndjson");
        let mut skipped = 0;
        let pending = resend_plan(read_pending(&path, &mut skipped)?, &mut skipped);
        let tmp = staging(&path);
        let err = |e: std::io::Error| format!("--spool {}: {e}", tmp.display());
        // The resend is journaled as it would be when added, in a new journal that replaces
        // the old one once whole and synced.
        let mut journal = Journal {
            path: path.clone(),
            file: create_private(&tmp).map_err(err)?,
            write_failures: crate::said::Said::default(),
            size: 0,
            compact_at,
            compact_every: compact_at,
            live_cap,
            next: 0,
            live: BTreeMap::new(),
            order: HashMap::new(),
            written: VecDeque::new(),
            live_bytes: 0,
            joins: HashMap::new(),
            joins_bytes: 0,
            left: VecDeque::new(),
            restored: HashMap::new(),
            restored_for: HashMap::new(),
            texts: HashMap::new(),
            lingering: HashMap::new(),
            untracked: false,
            damaged: None,
            torn: false,
            repair_every: REPAIR_EVERY,
        };
        let mut lines = String::new();
        for e in &pending {
            let whose = (who(e), text_of(e));
            journal.add(&mut lines, e.id(), e.kind(), whose, add_record(e), false);
        }
        let written = journal
            .file
            .write_all(lines.as_bytes())
            .and_then(|()| journal.file.sync_all())
            .map_err(err)
            .and_then(|()| {
                std::fs::rename(&tmp, &path).map_err(|e| format!("--spool {}: {e}", path.display()))
            });
        if let Err(e) = written {
            // What was written of it holds a disk that is likely full (or a file-size limit
            // reached): the old journal, still whole, is what the next start reads.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        journal.size = lines.len() as u64;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let errors = write_errors.clone();
        let writer = std::thread::Builder::new()
            .name("pvp-spool".into())
            .spawn(move || journal.run(&rx, &errors))
            .map_err(|e| format!("--spool: starting its writer thread: {e}"))?;
        let spool = Spool {
            path,
            _lock: lock,
            tx: Some(tx),
            writer: Some(writer),
            write_errors,
            behind: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            skipped,
        };
        Ok((spool, pending))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines of the journal the start skipped (the first 10 logged): records cut short (by a
    /// kill, or a full disk), lines that are no record (a journal damaged, or edited by hand
    /// or by another tool) and envelopes that cannot be sent. Text among them is lost: the
    /// gateway counts them (`pvp_t140_spool_records_skipped_total`).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Records that could not be written so far (tests; the gateway reads the counter).
    #[cfg(test)]
    fn write_errors(&self) -> u64 {
        self.write_errors.get()
    }

    fn hand_over(&self, r: Record) {
        let Some(tx) = &self.tx else { return };
        let r = match tx.try_send(r) {
            Ok(()) => {
                if self.behind.load(Ordering::Relaxed) && self.behind.swap(false, Ordering::Relaxed)
                {
                    tracing::info!(path = %self.path.display(), "spool journal caught up with the sink");
                }
                return;
            }
            Err(mpsc::TrySendError::Full(r)) => {
                // Once a stall, not once a record: a stalled disk would flood the log.
                if !self.behind.swap(true, Ordering::Relaxed) {
                    tracing::warn!(path = %self.path.display(), "spool journal {QUEUE} records behind the sink (a slow disk): the sink waits for it");
                }
                r
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                self.writer_gone();
                return;
            }
        };
        if tx.send(r).is_err() {
            self.writer_gone();
        }
    }

    /// A record the writer thread, gone, cannot take: counted; logged once (every record from
    /// then on comes here, as often as text).
    fn writer_gone(&self) {
        self.write_errors.inc();
        if !self.gone.swap(true, Ordering::Relaxed) {
            tracing::error!(path = %self.path.display(), "spool writer gone: from now on nothing is journaled, and what is sent would not survive a crash (each record counted in pvp_t140_spool_write_errors_total)");
        }
    }

    /// Before an envelope is sent.
    pub fn added(&self, e: &Envelope) {
        self.add(e, false);
    }

    fn add(&self, e: &Envelope, again: bool) {
        // Text journaled again may need its participant's join back ([`Journal::add`]).
        let who = match again {
            true => Some((e.session_json().into(), e.sender().clone())),
            false => who(e),
        };
        self.hand_over(Record::Add {
            id: e.id(),
            kind: e.kind(),
            who,
            text_of: text_of(e),
            line: add_record(e),
            again,
        });
    }

    /// Once delivered (a join, a leave or an announce once its frame is written to the socket;
    /// text once the server is seen to read it, the ws sink's `Retry`), or given up on.
    pub fn done(&self, id: ulid::Ulid) {
        self.hand_over(Record::Done(id));
    }

    /// Text written, then refused by the server (RATE_LIMITED, PARTICIPANT_NOT_FOUND) or taken
    /// back from a connection lost before the server was seen to read it, to be sent again:
    /// undelivered (once more, if it was marked done), in its first place for a restart, a
    /// compaction in between or not: after what was journaled since (its participant's leave),
    /// it would be resent after the leave, on a connection with no join (pvp-spec 6.3).
    pub fn again(&self, e: &Envelope) {
        self.add(e, true);
    }

    /// Waits until everything handed over so far is written (or failed to be). Blocks: for
    /// the end of a run, off the connections' thread, and for tests.
    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        self.hand_over(Record::Flush(tx));
        let _ = rx.recv();
    }

    /// Tests: from now on the journal's writes go to `file`, and a failed one is repaired
    /// at the next batch.
    #[cfg(all(test, any(target_os = "linux", target_os = "android")))]
    fn swap_file(&self, file: File) {
        self.hand_over(Record::Swap(file));
        self.flush();
    }
}

/// The writer finishes what was handed over before the spool goes.
impl Drop for Spool {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.writer.take()
            && w.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "spool writer panicked");
        }
    }
}

impl Journal {
    /// The writer thread: takes what is handed over, as many records as are waiting at once,
    /// and writes them with one write(2).
    fn run(mut self, rx: &mpsc::Receiver<Record>, errors: &Counter) {
        let mut batch = String::with_capacity(64 << 10);
        let mut flushed = Vec::new();
        while let Ok(first) = rx.recv() {
            // Records coming one by one from the connections are written together: the sink
            // pays no wake-up of this thread for the ones that arrive meanwhile, and this
            // thread one write(2) for all of them.
            if !matches!(first, Record::Flush(_)) {
                std::thread::sleep(COALESCE);
            }
            let mut next = Some(first);
            while let Some(r) = next {
                match r {
                    Record::Add {
                        id,
                        kind,
                        who,
                        text_of,
                        line,
                        again,
                    } => self.add(&mut batch, id, kind, (who, text_of), line, again),
                    Record::Done(id) => self.done(&mut batch, id),
                    Record::Flush(tx) => flushed.push(tx),
                    #[cfg(all(test, any(target_os = "linux", target_os = "android")))]
                    Record::Swap(file) => {
                        self.file = file;
                        self.repair_every = Duration::ZERO;
                    }
                }
                next = if batch.len() < 1 << 20 {
                    rx.try_recv().ok()
                } else {
                    None
                };
            }
            self.write(&batch, errors);
            batch.clear();
            self.repair_or_compact();
            flushed.drain(..).for_each(|tx| {
                let _ = tx.send(());
            });
        }
        // The spool is going (the gateway stops): a journal still damaged gets a last chance
        // to be whole for the next start, whenever the last attempt was.
        if self.damaged.is_some() {
            self.damaged = Some(Instant::now());
            self.repair_or_compact();
        }
    }

    fn write(&mut self, records: &str, errors: &Counter) {
        if records.is_empty() {
            return;
        }
        let newline = if self.torn { "\n" } else { "" };
        match self
            .file
            .write_all(newline.as_bytes())
            .and_then(|()| self.file.write_all(records.as_bytes()))
        {
            Ok(()) => {
                self.size += (newline.len() + records.len()) as u64;
                self.torn = false;
            }
            Err(e) => {
                self.torn = true;
                errors.inc();
                // A full disk fails every batch, as often as text comes: logged at the first
                // and then every 10 s, with how many since.
                if let Some(failed_writes) = self.write_failures.tell(Instant::now(), 1) {
                    tracing::error!(path = %self.path.display(), failed_writes, "spool write failed ({e}): until the journal is rewritten whole, what was not written would not survive a crash (failed writes are logged at most every 10 s, with how many since; each is counted)");
                }
                // Part of it may have been written: the size is no longer known.
                self.size = self.file.metadata().map_or(self.size, |m| m.len());
                self.damaged.get_or_insert_with(Instant::now);
            }
        }
    }

    /// An envelope's `add` record, with its order (`"n"`, [`read_pending`]), appended to
    /// `batch` (what is written next) and kept for compacting: last, or `again` with the order
    /// it had when written, if that is remembered, so a restart puts it back in its place
    /// wherever in the file the record is (a compaction since took its first `add`).
    fn add(
        &mut self,
        batch: &mut String,
        id: ulid::Ulid,
        kind: Kind,
        (who, text_of): (Option<Who>, Option<u64>),
        plain: String,
        again: bool,
    ) {
        // Journaled again while still undelivered (text taken back before its pong marked it
        // done): its place; after it was written: the place it had, if remembered.
        let place = again
            .then(|| {
                self.order.get(&id).copied().or_else(|| {
                    let i = self.written.iter().rposition(|(w, _)| *w == id)?;
                    self.written.remove(i).map(|(_, n)| n)
                })
            })
            .flatten();
        let n = place.unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        // A join's `join` record for compacting, made of the line without the order.
        let join = (kind == Kind::SessionJoin && !self.untracked).then(|| join_record(&plain));
        let mut record = plain;
        record.truncate(record.len() - "}\n".len());
        let _ = writeln!(record, ",\"n\":{n}}}");
        batch.push_str(&record);
        if self.untracked {
            return;
        }
        if let Some(join) = join
            && let Some(who) = who.clone()
        {
            self.joins_bytes += join.len() as u64;
            if let Some((_, old)) = self.joins.insert(who, (n, join)) {
                self.joins_bytes -= old.len() as u64;
            }
        } else if kind == Kind::ParticipantAnnounce
            && let Some(who) = &who
            && let Some((_, join)) = self.joins.get_mut(who)
            && let Some(named) = join_as_announced(join, &record)
        {
            // The join a restart rejoins with carries the name announced since.
            self.joins_bytes = self.joins_bytes - join.len() as u64 + named.len() as u64;
            *join = named;
        } else if again && let Some(who) = &who {
            // Text refused after its participant's leave was written: its join, dropped with
            // the leave's mark, is kept again until the text is, so a compaction before the
            // next start leaves that start a join to rejoin with (pvp-spec 6.3: a
            // connection's first frame is a join).
            if !self.joins.contains_key(who)
                && let Some(i) = self.left.iter().rposition(|(_, w, _)| w == who)
                && let Some((_, _, (at, join))) = self.left.remove(i)
            {
                self.joins_bytes += join.len() as u64;
                self.joins.insert(who.clone(), (at, join));
                // Text still waiting on a join put back before keeps its count.
                self.restored_for
                    .entry(who.clone())
                    .and_modify(|(j, _)| *j = at)
                    .or_insert((at, 0));
            }
            if let Some((_, texts)) = self.restored_for.get_mut(who)
                && self.restored.insert(n, who.clone()).is_none()
            {
                *texts += 1;
            }
        }
        let leave_of = who.filter(|_| kind == Kind::SessionLeave);
        self.live_bytes += record.len() as u64;
        self.order.insert(id, n);
        let live = Live {
            record,
            leave_of,
            text_of,
        };
        match self.live.insert(n, live) {
            // Journaled again while still undelivered: counted once.
            Some(old) => self.live_bytes -= old.record.len() as u64,
            None => {
                if let Some(whose) = text_of {
                    *self.texts.entry(whose).or_default() += 1;
                }
            }
        }
        if self.live_bytes > self.live_cap {
            tracing::warn!(
                undelivered_bytes = self.live_bytes,
                "spool: too much undelivered to compact the journal in memory; it grows until the next start"
            );
            self.untracked = true;
            self.live = BTreeMap::new();
            self.order = HashMap::new();
            self.joins = HashMap::new();
            self.left = VecDeque::new();
            self.restored = HashMap::new();
            self.restored_for = HashMap::new();
            self.texts = HashMap::new();
            self.lingering = HashMap::new();
        }
    }

    /// A frame's `done` record, appended to `batch`; its envelope is no longer kept.
    fn done(&mut self, batch: &mut String, id: ulid::Ulid) {
        batch.push_str("{\"done\":\"");
        batch.push_str(id.array_to_str(&mut [0; ulid::ULID_LEN]));
        batch.push_str("\"}\n");
        if let Some(n) = self.order.remove(&id)
            && let Some(l) = self.live.remove(&n)
        {
            self.live_bytes -= l.record.len() as u64;
            if self.written.len() == PLACES_KEPT {
                self.written.pop_front();
            }
            self.written.push_back((id, n));
            // Left: a restart will not need its join, unless it joined again since, or it has
            // text still undelivered (kept until that is done), or text refused after the
            // leave comes back (kept a while for that).
            if let Some(who) = l.leave_of
                && let Some(&(at, _)) = self.joins.get(&who)
                && at < n
            {
                let whose = who_hash(&who.0, &who.1);
                if self.texts.contains_key(&whose) {
                    self.lingering.insert(whose, (who, at));
                } else {
                    self.let_join_go(who, at);
                }
            }
            if let Some(whose) = l.text_of {
                self.text_done(whose);
            }
            // Text refused after its participant's leave, delivered or given up at last: its
            // join is no longer needed, unless the participant joined again since.
            if let Some(who) = self.restored.remove(&n)
                && let Some((at, texts)) = self.restored_for.get_mut(&who)
            {
                *texts = texts.saturating_sub(1);
                if *texts == 0 {
                    let at = *at;
                    self.restored_for.remove(&who);
                    if self.joins.get(&who).is_some_and(|(j, _)| *j == at)
                        && let Some((_, old)) = self.joins.remove(&who)
                    {
                        self.joins_bytes -= old.len() as u64;
                    }
                }
            }
        }
    }

    /// Text of `whose` ([`who_hash`]) is done: once none of it is undelivered, the join kept
    /// for it after its participant's leave goes.
    fn text_done(&mut self, whose: u64) {
        let Some(texts) = self.texts.get_mut(&whose) else {
            return;
        };
        *texts -= 1;
        if *texts == 0 {
            self.texts.remove(&whose);
            if let Some((who, at)) = self.lingering.remove(&whose) {
                self.let_join_go(who, at);
            }
        }
    }

    /// The join of `who` (made at order `at`), whose leave was written, is no longer kept for
    /// a restart (unless it joined again since): kept a while in `left`, for text refused after
    /// the leave.
    fn let_join_go(&mut self, who: Who, at: u64) {
        if self.joins.get(&who).is_none_or(|(j, _)| *j != at) {
            return;
        }
        let Some(old) = self.joins.remove(&who) else {
            return;
        };
        self.joins_bytes -= old.1.len() as u64;
        let now = Instant::now();
        while self.left.len() >= PLACES_KEPT
            || self
                .left
                .front()
                .is_some_and(|(t, ..)| now >= *t + LEFT_KEPT)
        {
            self.left.pop_front();
        }
        self.left.push_back((now, who, old));
    }

    /// Bytes a compaction would write.
    fn kept_bytes(&self) -> u64 {
        self.live_bytes + self.joins_bytes
    }

    /// After a batch: a journal a write failed on is rewritten whole from memory (at most once
    /// a [`REPAIR_EVERY`]), which puts back what the failed writes lost; a large one, mostly
    /// delivered, is compacted.
    fn repair_or_compact(&mut self) {
        if self.untracked {
            return;
        }
        let repair = self.damaged.is_some_and(|at| Instant::now() >= at);
        let due = self.size >= self.compact_at && self.kept_bytes() <= self.size / 2;
        if !repair && !due {
            return;
        }
        let (before, started) = (self.size, Instant::now());
        match self.compact() {
            // Either way the journal is whole now, and is next compacted at its threshold, not
            // where a failed compaction put it (each failure raised the bound for good).
            Ok(()) if self.damaged.take().is_some() => {
                self.compact_at = self.compact_every;
                tracing::warn!(path = %self.path.display(), after = self.size, "spool journal rewritten whole after failed writes");
            }
            Ok(()) => {
                self.compact_at = self.compact_every;
                tracing::info!(path = %self.path.display(), before, after = self.size, took = ?started.elapsed(), "spool journal compacted")
            }
            Err(e) if repair => {
                self.damaged = Some(Instant::now() + self.repair_every);
                tracing::error!(path = %self.path.display(), "spool journal could not be rewritten after failed writes ({e}); tried again in {:?}", self.repair_every);
            }
            Err(e) => {
                // The old journal is still whole and still appended to: nothing is lost,
                // it only stays large. Tried again a threshold on.
                self.compact_at = self.size.saturating_add(self.compact_every);
                tracing::error!(path = %self.path.display(), "spool journal not compacted ({e}); it keeps growing");
            }
        }
    }

    /// Rewrites the journal with only what a restart needs: each participant's latest join
    /// (as a `join` record, never resent itself) and the undelivered envelopes in order. The
    /// new file replaces the old one only once it is whole; until then, and if anything fails,
    /// the old one is kept and appended to. Not synced: like every record, it is to survive the
    /// process, not a power cut, and a sync here stalled the connections' thread (a 2,000
    /// participant run's worst latency went from 18 to 80 ms, when the journal was written on
    /// that thread).
    fn compact(&mut self) -> std::io::Result<()> {
        let tmp = staging(&self.path);
        let rewritten = self.rewrite(&tmp);
        if rewritten.is_err() {
            // What was written of it holds a disk that is likely full: the journal's own
            // appends may still fit in it.
            let _ = std::fs::remove_file(&tmp);
        }
        rewritten
    }

    /// [`Journal::compact`] through `tmp`.
    fn rewrite(&mut self, tmp: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(64 << 10, create_private(tmp)?);
        let mut size = 0;
        let joins = self.joins.values().map(|(_, r)| r);
        for r in joins.chain(self.live.values().map(|l| &l.record)) {
            out.write_all(r.as_bytes())?;
            size += r.len() as u64;
        }
        let file = out
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        std::fs::rename(tmp, &self.path)?;
        // The handle written through is the journal now; it goes on at its end. Closing the
        // old one frees the replaced file, tens of MB: done on a thread of its own, so as not
        // to hold up the records behind.
        let old = std::mem::replace(&mut self.file, file);
        if std::thread::Builder::new()
            .name("spool-free".into())
            .spawn(move || drop(old))
            .is_err()
        {
            tracing::debug!("spool: no thread to close the old journal; closed here");
        }
        self.size = size;
        self.torn = false;
        Ok(())
    }
}

/// Takes `dir` for this process: a second gateway on the same directory would read the first
/// one's undelivered envelopes and send them too, then replace the journal the first one goes
/// on appending to (through its open handle, into a file no longer in the directory), so a kill
/// of the first would lose what it had not delivered. Held (an advisory lock on
/// `DIR/journal.lock`) until the spool is dropped or the process ends, however it ends. A
/// filesystem without locks (some network ones) is used unlocked, with a warning.
fn lock(dir: &Path) -> Result<Option<File>, String> {
    let path = dir.join("journal.lock");
    let err = |e: std::io::Error| format!("--spool {}: {e}", path.display());
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "--spool {}: in use by another running gateway (its journal.lock is locked)",
            dir.display()
        )),
        Err(std::fs::TryLockError::Error(e)) if without_locks(&e) => {
            tracing::warn!(path = %path.display(), "--spool: this filesystem has no file locks; make sure no other gateway uses the directory");
            Ok(None)
        }
        Err(std::fs::TryLockError::Error(e)) => Err(err(e)),
    }
}

/// Whether a lock's error says the filesystem keeps no locks ([`lock`]): EOPNOTSUPP or ENOSYS,
/// or on Linux ENOLCK, what flock(2) gives on NFS with no lock daemon to ask.
fn without_locks(e: &std::io::Error) -> bool {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if e.raw_os_error() == Some(nix::errno::Errno::ENOLCK as i32) {
        return true;
    }
    e.kind() == std::io::ErrorKind::Unsupported
}

/// Where a new journal is written before it replaces `path`, whole.
fn staging(path: &Path) -> PathBuf {
    path.with_extension("ndjson.new")
}

/// A new journal at `path`, readable and writable by its owner only: it holds the text of
/// every transcript not yet delivered (the umask may take more away). One left there (a kill
/// mid-compaction, an older gateway) goes first, so its mode is not the new one's.
fn create_private(path: &Path) -> std::io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut options = File::options();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// A journal line recording an envelope about to be sent.
fn add_record(e: &Envelope) -> String {
    format!("{{\"add\":{}}}\n", e.json())
}

/// The `join` line a compaction keeps of a join's `add` line.
fn join_record(add: &str) -> String {
    let envelope = add
        .strip_prefix("{\"add\":")
        .and_then(|r| r.strip_suffix("}\n"))
        .unwrap_or("null");
    format!("{{\"join\":{envelope}}}\n")
}

/// A `join` record with the participant as an announce's `add` line describes it (pvp-spec
/// 7.1: a name learnt from RTCP after the join): a restart rejoins under the current name, as
/// a reconnect does ([`Envelope::join_as_announced`]).
fn join_as_announced(join: &str, announce_add: &str) -> Option<String> {
    let mut j: Value = serde_json::from_str(join).ok()?;
    let a: Value = serde_json::from_str(announce_add).ok()?;
    *j.get_mut("join")?
        .get_mut("payload")?
        .get_mut("participant")? = a.get("add")?.get("payload")?.clone();
    Some(format!("{j}\n"))
}

/// A participant in a session, as a journal's message names it.
type MessageWho = (String, String);

fn message_who(m: &Message) -> MessageWho {
    (m.session.clone(), m.sender.clone())
}

/// The journal's undelivered envelopes in their places, and the last join of every sender.
/// Each `add` record carries its envelope's order (`"n"`); one journaled again
/// ([`Spool::again`]) carries its old order, so an envelope goes where its smallest order
/// puts it, wherever its records are in the file (after its participant's leave, a compaction
/// having taken its first `add`) and however often it was journaled again. A journal whose
/// records have no order (written before they had one) keeps each envelope where its first
/// record puts it: a record repeated later never moves it. What is marked done is let go as the
/// mark is read (a journal past [`LIVE_CAP`], no longer compacted, holds all the traffic since
/// the last start); the places of the last [`PLACES_READ`] envelopes marked are kept, for one
/// journaled again after its mark.
fn read_pending(
    path: &Path,
    skipped: &mut u64,
) -> Result<(Vec<Message>, HashMap<MessageWho, Message>), String> {
    // Not a regular file (a FIFO, which the open would wait on for a writer for ever; a
    // directory; a device): refused at start, not read.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(format!(
                "--spool {}: not a regular file ({:?}); move it away",
                path.display(),
                m.file_type()
            ));
        }
        _ => {}
    }
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(format!("--spool {}: {e}", path.display())),
    };
    // Every envelope not (yet) marked done, once, by id: its order (if its records have one),
    // the place of its first record, and the envelope.
    let mut adds: HashMap<String, (Place, Message)> = HashMap::new();
    // The places of the envelopes last marked done, the newest last.
    let mut delivered: HashMap<String, Place> = HashMap::new();
    let mut delivered_order: VecDeque<String> = VecDeque::new();
    let mut numbered = true;
    let mut joins: HashMap<MessageWho, Message> = HashMap::new();
    // A line skipped: counted, and logged if among the first [`SKIPS_LOGGED`] (a journal
    // damaged throughout, or another tool's file, made a log line a line).
    let mut skip = |line: usize, what: &str| {
        *skipped += 1;
        if *skipped <= SKIPS_LOGGED {
            tracing::warn!(path = %path.display(), line, "skipping {what}");
        }
    };
    // Lines as bytes: a record cut short (a kill, or a write stopped at a page boundary by a
    // full disk) may end inside a UTF-8 character, and must be skipped like any other
    // incomplete record, not stop the gateway from starting.
    for (n, line) in BufReader::new(f).split(b'\n').enumerate() {
        let line = line.map_err(|e| format!("--spool {}: {e}", path.display()))?;
        if line.is_empty() {
            continue; // after a failed write (`Journal::torn`)
        }
        let Ok(v) = serde_json::from_slice::<Value>(&line) else {
            // A record cut short by the kill: the last line may be partial.
            skip(n + 1, "an incomplete journal record");
            continue;
        };
        if let Some(id) = v.get("done").and_then(Value::as_str) {
            if let Some((place, _)) = adds.remove(id) {
                if delivered_order.len() == PLACES_READ
                    && let Some(old) = delivered_order.pop_front()
                {
                    delivered.remove(&old);
                }
                delivered.insert(id.to_owned(), place);
                delivered_order.push_back(id.to_owned());
            }
        } else if let Some(j) = v
            .get("join")
            .and_then(|e| serde_json::from_value::<Message>(e.clone()).ok())
        {
            // A compacted journal's copy of a join: for rejoining, never resent itself.
            joins.insert(message_who(&j), j);
        } else if let Some(e) = v
            .get("add")
            .and_then(|e| serde_json::from_value::<Message>(e.clone()).ok())
        {
            let order = v.get("n").and_then(Value::as_u64);
            numbered &= order.is_some();
            // Added again (`Spool::again`), after it was done or not: undelivered, in its
            // place.
            let again = adds.get_mut(&e.id).map(|(p, _)| p);
            if let Some(first) = again {
                first.again(order);
                continue;
            }
            if let Some(mut first) = delivered.remove(&e.id) {
                first.again(order);
                adds.insert(e.id.clone(), (first, e));
                continue;
            }
            // A join's payload is an object (pvp-spec 6.3); one that is not, in a journal
            // damaged or written by hand, is no join to rejoin with (and indexing it would
            // panic).
            if e.kind == "session.join" && e.payload.is_object() {
                joins.insert(message_who(&e), e.clone());
            } else if e.kind == "participant.announce"
                && let Some(j) = joins.get_mut(&message_who(&e))
                && let Some(join) = j.payload.as_object_mut()
            {
                // Delivered or not, it names the participant a restart rejoins.
                join.insert("participant".into(), e.payload.clone());
            }
            adds.insert(e.id.clone(), (Place { order, first: n }, e));
        } else {
            // JSON, but no record (or an envelope that is none): damaged, or foreign.
            skip(n + 1, "a journal line that is no record");
        }
    }
    if *skipped > SKIPS_LOGGED {
        tracing::warn!(path = %path.display(), skipped = *skipped, "journal lines skipped in all (the first {SKIPS_LOGGED} logged)");
    }
    let mut adds: Vec<(Place, Message)> = adds.into_values().collect();
    // By the first record; by order if every record has one (records of a damaged journal
    // with one order stay in the order written).
    adds.sort_by_key(|(p, _)| p.first);
    if numbered {
        adds.sort_by_key(|(p, _)| p.order);
    }
    Ok((adds.into_iter().map(|(_, e)| e).collect(), joins))
}

/// Journal lines a start skips that it logs one by one ([`read_pending`]); the rest are
/// counted, and their number logged.
const SKIPS_LOGGED: u64 = 10;

/// Envelopes marked done whose places a start keeps ([`read_pending`]): four times the places
/// a running journal remembers ([`PLACES_KEPT`]), some 20 MiB at most.
const PLACES_READ: usize = 4 * PLACES_KEPT;

/// Where an envelope goes in a restart's resend ([`read_pending`]).
#[derive(Debug, Clone, Copy)]
struct Place {
    /// Its smallest order (`"n"`), if its records have one.
    order: Option<u64>,
    /// The line of its first record.
    first: usize,
}

impl Place {
    /// A record journaling it again, with `order`: the smallest order stands.
    fn again(&mut self, order: Option<u64>) {
        if let (Some(first), Some(order)) = (&mut self.order, order) {
            *first = (*first).min(order);
        }
    }
}

/// What to send after a restart: per participant, in the journal's order, a fresh join (its
/// old connection is gone; a new one is bound by its first frame), the undelivered envelopes
/// (a fresh join again before any that follows a leave), and a leave (its stream went down
/// with the old process), unless they are already there.
fn resend_plan(
    (pending, joins): (Vec<Message>, HashMap<MessageWho, Message>),
    skipped: &mut u64,
) -> Vec<Envelope> {
    let mut ids = crate::pvp::IdGen::new(crate::clock::random_seed());
    let now = crate::time::Time::from_system(std::time::SystemTime::now());
    let mut order: Vec<MessageWho> = Vec::new();
    let mut by_sender: HashMap<MessageWho, Vec<Message>> = HashMap::new();
    for e in pending {
        // One that cannot be sent (a kind the gateway never sends, an id that is no ULID: a
        // journal edited by hand or by another tool) is no reason for a rejoin and a leave.
        if let Err(why) = e.to_envelope() {
            *skipped += 1;
            if *skipped <= SKIPS_LOGGED {
                tracing::warn!("journal record not re-sent: {why}");
            }
            continue;
        }
        let who = message_who(&e);
        if !by_sender.contains_key(&who) {
            order.push(who.clone());
        }
        by_sender.entry(who).or_default().push(e);
    }
    let mut out = Vec::new();
    for sender in order {
        let list = by_sender.remove(&sender).unwrap_or_default();
        if list.iter().all(|e| e.kind == "session.leave")
            && list.len() == 1
            && !joins.contains_key(&sender)
        {
            continue; // a lone leave of a participant we cannot rejoin: nothing to say
        }
        let ends_with_leave = list.last().is_some_and(|e| e.kind == "session.leave");
        let template = list.last().cloned();
        // A rejoin before the first envelope, and before any that follows a leave (one
        // journaled again after the leave, whose place was no longer known, [`PLACES_KEPT`]):
        // a connection's first frame must be the join (pvp-spec 6.3).
        let mut present = false;
        for e in list {
            if !present && e.kind != "session.join" {
                match joins.get(&sender) {
                    Some(j) => {
                        let mut j = j.clone();
                        j.id = ids.next(now).to_string();
                        j.ts = now.to_iso8601();
                        out.push(j);
                    }
                    None => {
                        tracing::warn!(session = %sender.0, sender = %sender.1, "undelivered envelopes without a join in the journal: sending them anyway")
                    }
                }
            }
            present = e.kind != "session.leave";
            out.push(e);
        }
        if !ends_with_leave && let Some(mut leave) = template {
            leave.kind = "session.leave".into();
            leave.id = ids.next(now).to_string();
            leave.ts = now.to_iso8601();
            leave.payload = json!({ "reason": "gateway restarted" });
            leave.reference = None;
            out.push(leave);
        }
    }
    out.into_iter()
        .filter_map(|m| {
            m.to_envelope()
                .map_err(|e| {
                    *skipped += 1;
                    if *skipped <= SKIPS_LOGGED {
                        tracing::warn!("journal record not re-sent: {e}");
                    }
                })
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pvp::Builder;
    use crate::time::Time;

    /// A spool directory of its own, with the thresholds a test wants, removed afterwards even
    /// when the test fails.
    struct Scratch {
        dir: PathBuf,
        compact_at: u64,
        live_cap: u64,
    }

    impl Scratch {
        fn new(name: &str, compact_at: u64, live_cap: u64) -> Self {
            let dir =
                std::env::temp_dir().join(format!("pvp-t140-spool-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Scratch {
                dir,
                compact_at,
                live_cap,
            }
        }

        /// The spool as a (re)started gateway opens it.
        fn open(&self) -> (Spool, Vec<Envelope>) {
            Spool::open_with(
                &self.dir,
                self.compact_at,
                self.live_cap,
                Counter::default(),
            )
            .unwrap()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    struct Talk {
        b: Builder,
        t: u64,
    }

    impl Talk {
        fn new() -> Self {
            Talk {
                b: Builder::new("s".into(), None, 7),
                t: 1_700_000_000_000,
            }
        }
        fn env(&mut self, who: &str, kind: Kind, payload: Value) -> Envelope {
            self.t += 1;
            self.b.envelope(
                Time::from_millis(self.t),
                SenderId::from(who),
                kind,
                &payload,
            )
        }
        fn join(&mut self, who: &str) -> Envelope {
            self.env(who, Kind::SessionJoin, json!({"participant": {"id": who}}))
        }
        fn add(&mut self, who: &str, text: &str) -> Envelope {
            self.env(who, Kind::ContextAdd, json!({"content": text}))
        }
        fn leave(&mut self, who: &str) -> Envelope {
            self.env(who, Kind::SessionLeave, json!({"reason": "bye"}))
        }
    }

    /// Journaled, then written to the server.
    fn deliver(spool: &Spool, e: &Envelope) {
        spool.added(e);
        spool.done(e.id());
    }

    fn summary(plan: &[Envelope]) -> Vec<String> {
        plan.iter()
            .map(|e| {
                let m = e.to_message();
                match m.payload.get("content").and_then(Value::as_str) {
                    Some(c) => format!("{} {} {c}", m.sender, m.kind),
                    None => format!("{} {}", m.sender, m.kind),
                }
            })
            .collect()
    }

    /// A chunk written (and marked done) that the server then refuses as RATE_LIMITED is
    /// journaled again (`Spool::again`) to go after the pause. A gateway killed during the
    /// pause must send it on restart, where it was, before the leave behind it: a user expects
    /// text the server never took not to be lost to the journal's earlier `done`.
    #[test]
    fn a_chunk_refused_after_it_was_written_is_resent_in_its_place_by_a_restart() {
        let d = Scratch::new("again", COMPACT_AT, LIVE_CAP);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        let (j, first, second) = (
            talk.join("alice"),
            talk.add("alice", "First."),
            talk.add("alice", "Second."),
        );
        for e in [&j, &first, &second] {
            deliver(&spool, e);
        }
        spool.added(&talk.leave("alice"));
        spool.again(&first);
        drop(spool);
        let (spool, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "alice session.join",
                "alice context.add First.",
                "alice session.leave"
            ]
        );
        // Taken at last: nothing is left for the next start.
        for e in &resend {
            spool.done(e.id());
        }
        drop(spool);
        assert!(d.open().1.is_empty());
    }

    /// The same with a compaction during the pause: the chunk journaled again keeps its place
    /// before the leave journaled meanwhile, so the restart rejoins, sends it and leaves
    /// (journaled last, it was resent after the leave, on a connection with no join: a server
    /// refuses that, pvp-spec 6.3). A review found it (review, session 34).
    #[test]
    fn a_chunk_journaled_again_before_a_compaction_is_resent_before_its_leave() {
        let d = Scratch::new("again-compact", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let chunk = talk.add("alice", "Refused for the rate, to go again.");
        deliver(&spool, &chunk);
        // The leave reaches the journal while the connection waits out the pause; then the
        // refusal is read and the chunk journaled again.
        spool.added(&talk.leave("alice"));
        spool.again(&chunk);
        spool.flush();
        // Someone else's delivered traffic grows the journal: it is compacted.
        deliver(&spool, &talk.join("bob"));
        for i in 0..200 {
            deliver(&spool, &talk.add("bob", &format!("Filler number {i}.")));
        }
        deliver(&spool, &talk.leave("bob"));
        spool.flush();
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!journal.contains("Filler number 0."), "not compacted");
        // Killed during the pause.
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "alice session.join",
                "alice context.add Refused for the rate, to go again.",
                "alice session.leave",
            ]
        );
    }

    /// The same with the compaction between the chunks' `done` and the refusals: the journal
    /// no longer has their first `add`, and the `add` written again goes at its end, after the
    /// leave. It carries the chunk's old order, so a restart still sends the chunks, in their
    /// order whatever the order of the refusals, before the leave (they came after it, behind a
    /// second join and leave, until the next compaction). A review found it (review, session
    /// 34).
    #[test]
    fn a_chunk_journaled_again_after_a_compaction_is_resent_before_its_leave() {
        let d = Scratch::new("compact-again", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let (first, second) = (talk.add("alice", "First."), talk.add("alice", "Second."));
        deliver(&spool, &first);
        deliver(&spool, &second);
        // The leave is journaled while the connection still holds the chunks.
        spool.added(&talk.leave("alice"));
        // Someone else's delivered traffic grows the journal: it is compacted (the chunks,
        // delivered, are not kept; the leave is).
        deliver(&spool, &talk.join("bob"));
        for i in 0..200 {
            deliver(&spool, &talk.add("bob", &format!("Filler number {i}.")));
        }
        spool.flush();
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(
            !journal.contains("First.") && journal.contains("\"bye\""),
            "not compacted: {journal}"
        );
        // Then the refusals are read, the later chunk's first: both are journaled again.
        spool.again(&second);
        spool.again(&first);
        // Killed now.
        drop(spool);
        let (_, resend) = d.open();
        let alice: Vec<_> = summary(&resend)
            .into_iter()
            .filter(|l| l.starts_with("alice"))
            .collect();
        assert_eq!(
            alice,
            [
                "alice session.join",
                "alice context.add First.",
                "alice context.add Second.",
                "alice session.leave",
            ]
        );
    }

    /// Text journaled again while still undelivered (a connection lost before the server's
    /// pong showed it read takes it back, and it is marked done only once read) keeps its
    /// place, and is let go once done. It got a second place, the first kept for ever: a
    /// compaction wrote it again, and every later start sent it again.
    #[test]
    fn text_journaled_again_before_it_was_done_keeps_its_place_and_goes_once_done() {
        let d = Scratch::new("again-undelivered", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let (first, second) = (talk.add("alice", "First."), talk.add("alice", "Second."));
        spool.added(&first);
        spool.added(&second);
        // The connection is lost before either is seen read: both go again; after the
        // rejoin, only the first is seen read before a compaction and a kill.
        spool.again(&first);
        spool.again(&second);
        spool.done(first.id());
        compact_with_filler(&spool, &mut talk);
        drop(spool);
        let (spool, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add Second.",
                "alice session.leave"
            ]
        );
        drop(spool);
    }

    /// Chunks journaled again after a compaction keep the order of their places when one of
    /// them is refused twice: "Second." is refused, sent again and written; "First." is
    /// refused; "Second." is refused once more. Put in the order of their records in the file,
    /// a restart sent "Second." before "First." (pvp-spec 19.5); each record carries its
    /// chunk's old order. A review found it (review, session 34).
    #[test]
    fn chunks_journaled_again_after_a_compaction_keep_their_order_when_one_is_refused_twice() {
        let d = Scratch::new("compact-twice", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let (first, second) = (talk.add("alice", "First."), talk.add("alice", "Second."));
        deliver(&spool, &first);
        deliver(&spool, &second);
        // The leave is journaled while the connection still holds the chunks.
        spool.added(&talk.leave("alice"));
        compact_with_filler(&spool, &mut talk);
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(
            !journal.contains("First.") && !journal.contains("Second."),
            "not compacted: {journal}"
        );
        // "Second." refused, sent again after the pause, and written.
        spool.again(&second);
        spool.done(second.id());
        // "First." refused; then "Second." refused once more.
        spool.again(&first);
        spool.again(&second);
        // Killed now.
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add First.",
                "alice context.add Second.",
                "alice session.leave",
            ]
        );
    }

    /// The same with three chunks refused in turns ("Two.", "Three.", then "Two." written
    /// again, "One." and "Two." refused): a restart sends them in the order they were said,
    /// before the leave (pvp-spec 19.5). A review found it (review, session 34).
    #[test]
    fn chunks_refused_in_turns_after_a_compaction_keep_their_order() {
        let d = Scratch::new("compact-moved", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let chunks = [
            talk.add("alice", "One."),
            talk.add("alice", "Two."),
            talk.add("alice", "Three."),
        ];
        for c in &chunks {
            deliver(&spool, c);
        }
        spool.added(&talk.leave("alice"));
        compact_with_filler(&spool, &mut talk);
        let [one, two, three] = &chunks;
        // "Two." refused, then "Three.".
        spool.again(two);
        spool.again(three);
        // "Two." is written again; "One." refused; "Two." refused once more.
        spool.done(two.id());
        spool.again(one);
        spool.again(two);
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add One.",
                "alice context.add Two.",
                "alice context.add Three.",
                "alice session.leave",
            ]
        );
    }

    /// A chunk journaled again before an envelope that is itself journaled again later keeps
    /// its participant's order, with no compaction: alice's "One." and "Two." are written;
    /// bob's chunk, handed to the sink after them, is not yet. "One." is refused, bob's chunk
    /// written, then "Two." refused, then bob's chunk. A restart sends alice's "One." before
    /// "Two." (pvp-spec 19.5); placed before bob's chunk, which then moved after "Two.", it
    /// went after "Two.". A review found it (review, session 34).
    #[test]
    fn a_chunk_journaled_again_before_an_envelope_journaled_again_later_keeps_its_order() {
        let d = Scratch::new("moved-target", COMPACT_AT, LIVE_CAP);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let (one, two) = (talk.add("alice", "One."), talk.add("alice", "Two."));
        deliver(&spool, &one);
        deliver(&spool, &two);
        deliver(&spool, &talk.join("bob"));
        let bobs = talk.add("bob", "Bob speaks.");
        // Handed to the sink; bob's connection has not written it yet.
        spool.added(&bobs);
        spool.again(&one);
        spool.done(bobs.id());
        spool.again(&two);
        spool.again(&bobs);
        // Killed now (what was handed over is written: the writer finishes).
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add One.",
                "alice context.add Two.",
                "alice session.leave",
            ]
        );
        assert_eq!(
            said_by(&resend, "bob"),
            [
                "bob session.join",
                "bob context.add Bob speaks.",
                "bob session.leave",
            ]
        );
    }

    /// The same with alice's leave undelivered behind them: her chunks go in their order,
    /// before her leave. A review found it (review, session 34).
    #[test]
    fn chunks_journaled_again_in_turns_with_anothers_keep_their_order_before_the_leave() {
        let d = Scratch::new("moved-target-leave", COMPACT_AT, LIVE_CAP);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        deliver(&spool, &talk.join("bob"));
        let (one, two) = (talk.add("alice", "One."), talk.add("alice", "Two."));
        deliver(&spool, &one);
        deliver(&spool, &two);
        let bobs = talk.add("bob", "Bob speaks.");
        spool.added(&bobs);
        // alice leaves; her leave waits behind what her connection holds.
        spool.added(&talk.leave("alice"));
        spool.again(&one);
        spool.done(bobs.id());
        spool.again(&two);
        spool.again(&bobs);
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add One.",
                "alice context.add Two.",
                "alice session.leave",
            ]
        );
    }

    /// A journal whose records have no order (as builds before the order field wrote it, with
    /// a chunk journaled again as a plain `add` at the end, after its participant's leave)
    /// keeps the chunk where its first record is: a restart sends it before the leave, not
    /// join, leave, join, the chunk, leave (README: "in its place (before its participant's
    /// leave, a compaction or not)"). A review found it (review, session 34).
    #[test]
    fn a_journal_without_orders_keeps_a_chunk_where_its_first_record_is() {
        let d = Scratch::new("old-journal", COMPACT_AT, LIVE_CAP);
        std::fs::create_dir_all(&d.dir).unwrap();
        let mut talk = Talk::new();
        let (join, first, second, leave) = (
            talk.join("alice"),
            talk.add("alice", "First."),
            talk.add("alice", "Second."),
            talk.leave("alice"),
        );
        let done = |e: &Envelope| format!("{{\"done\":\"{}\"}}\n", e.id());
        let journal = [
            add_record(&join),
            done(&join),
            add_record(&first),
            done(&first),
            add_record(&second),
            done(&second),
            add_record(&leave),
            add_record(&first),
        ]
        .concat();
        std::fs::write(d.dir.join("journal.ndjson"), journal).unwrap();
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "alice session.join",
                "alice context.add First.",
                "alice session.leave"
            ]
        );
    }

    /// Past the memory cap (the journal untracked, only appended to), a chunk written before
    /// and journaled again still goes before its participant's leave: its record carries its
    /// old order (the places of what was written are kept past the cap), and its first record
    /// is in the file too. A review found it (review, session 34: the plain record appended
    /// at the end put it after the leave).
    #[test]
    fn past_the_memory_cap_a_chunk_journaled_again_goes_before_its_leave() {
        let d = Scratch::new("untracked", 2 << 10, 4 << 10);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let first = talk.add("alice", "First.");
        deliver(&spool, &first);
        deliver(&spool, &talk.add("alice", "Second."));
        spool.added(&talk.leave("alice"));
        // Someone else's undelivered text passes the cap: untracked from here on.
        spool.added(&talk.join("bob"));
        let filler: Vec<_> = (0..8)
            .map(|_| {
                let e = talk.add("bob", &"x".repeat(1 << 10));
                spool.added(&e);
                e.id()
            })
            .collect();
        spool.flush();
        // "First." refused and journaled again; bob's text is delivered at last.
        spool.again(&first);
        for id in filler {
            spool.done(id);
        }
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add First.",
                "alice session.leave"
            ]
        );
    }

    /// Text written just before its participant's leave and not yet seen read (its pong still
    /// to come) when the leave is written and marked done: the leave's mark dropped the join
    /// from what a compaction keeps, so a compaction then a kill left the text with no join, and
    /// the next start sent it first on a connection with no join (pvp-spec 6.3: refused). The
    /// join is kept while the participant has text undelivered, and goes once it is done.
    /// Found by review an (session 45).
    #[test]
    fn text_unread_when_its_participants_leave_is_done_keeps_its_join_through_a_compaction() {
        let d = Scratch::new("left-unread", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let text = talk.add("alice", "Written, its pong still to come.");
        spool.added(&text);
        deliver(&spool, &talk.leave("alice"));
        compact_with_filler(&spool, &mut talk);
        // Killed before the pong.
        drop(spool);
        let (spool, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add Written, its pong still to come.",
                "alice session.leave",
            ]
        );
        // This start delivers the resend (the text seen read): a compaction keeps nothing of
        // alice, whose join goes with her last text.
        let mut talk = Talk::new();
        for e in &resend {
            spool.done(e.id());
        }
        compact_with_filler(&spool, &mut talk);
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!journal.contains("alice"), "{journal}");
        drop(spool);
        assert!(d.open().1.is_empty());
    }

    /// The same participant back (a new join) before that text is done: its new join is kept
    /// once the old text is done, for what it says now.
    #[test]
    fn a_participant_back_before_its_text_unread_at_the_leave_is_done_keeps_its_new_join() {
        let d = Scratch::new("left-unread-back", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("alice"));
        let text = talk.add("alice", "Written, its pong still to come.");
        spool.added(&text);
        deliver(&spool, &talk.leave("alice"));
        deliver(&spool, &talk.join("alice"));
        spool.done(text.id());
        spool.added(&talk.add("alice", "Said after coming back."));
        compact_with_filler(&spool, &mut talk);
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            said_by(&resend, "alice"),
            [
                "alice session.join",
                "alice context.add Said after coming back.",
                "alice session.leave",
            ]
        );
    }

    /// Someone else's delivered traffic grows the journal past the scratch's threshold (16
    /// KiB): it is compacted.
    fn compact_with_filler(spool: &Spool, talk: &mut Talk) {
        deliver(spool, &talk.join("bob"));
        for i in 0..200 {
            deliver(spool, &talk.add("bob", &format!("Filler number {i}.")));
        }
        spool.flush();
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!journal.contains("Filler number 0."), "not compacted");
    }

    fn said_by(plan: &[Envelope], who: &str) -> Vec<String> {
        summary(plan)
            .into_iter()
            .filter(|l| l.starts_with(who))
            .collect()
    }

    /// Whatever follows a leave in a participant's undelivered envelopes (a chunk journaled
    /// again whose place was forgotten) comes after a rejoin: a connection's first frame is a
    /// join (pvp-spec 6.3). A review found it (review, session 34).
    #[test]
    fn a_restart_rejoins_before_what_follows_a_leave() {
        let mut talk = Talk::new();
        let join = talk.join("alice").to_message();
        let pending = [
            talk.leave("alice"),
            talk.add("alice", "Journaled again after the leave."),
        ]
        .iter()
        .map(Envelope::to_message)
        .collect();
        let joins = HashMap::from([(message_who(&join), join)]);
        assert_eq!(
            summary(&resend_plan((pending, joins), &mut 0)),
            [
                "alice session.join",
                "alice session.leave",
                "alice session.join",
                "alice context.add Journaled again after the leave.",
                "alice session.leave",
            ]
        );
    }

    /// Two gateways given the same `--spool DIR` (a restart while the old process still runs,
    /// or two instances from one config): the second read the first's undelivered text and
    /// sent it too, then swapped in a journal of its own, so every record the first wrote from
    /// then on went to a file no longer in the directory, and a kill of the first lost what
    /// it had not delivered. The second is refused at start; the first keeps its journal.
    /// A FIFO where the journal goes (a mistake, or another tool's) made the start wait for
    /// ever, opening it for a writer that never came (session 47, left by review bb); a
    /// directory there gave an I/O error naming no cause. Either is refused at start, saying
    /// it is not a regular file.
    #[test]
    fn a_journal_path_that_is_no_regular_file_is_refused_at_start() {
        let d = Scratch::new("fifo", 64 << 20, 1 << 20);
        std::fs::create_dir_all(&d.dir).unwrap();
        let path = d.dir.join("journal.ndjson");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = d.dir.clone();
        std::thread::spawn(move || {
            let opened = Spool::open_with(&dir, 64 << 20, 1 << 20, Counter::default());
            let _ = tx.send(opened.err());
        });
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the start waited on the FIFO")
            .expect("refused");
        assert!(err.contains("not a regular file"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let Err(err) = Spool::open_with(&d.dir, 64 << 20, 1 << 20, Counter::default()) else {
            panic!("a directory in the journal's place was taken");
        };
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_second_gateway_on_the_same_spool_directory_is_refused() {
        let d = Scratch::new("shared", 64 << 20, 1 << 20);
        let (first, _) = d.open();
        let mut talk = Talk::new();
        deliver(&first, &talk.join("olga"));
        first.added(&talk.add("olga", "Held by the first gateway."));
        first.flush();
        let second = Spool::open_with(&d.dir, d.compact_at, d.live_cap, Counter::default());
        assert!(
            second.is_err(),
            "a second gateway opened the spool the first one uses"
        );
        drop(second);
        first.added(&talk.add("olga", "Said after the second one tried."));
        drop(first);
        // The first is gone: the directory is free, and its journal has all it said.
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "olga session.join",
                "olga context.add Held by the first gateway.",
                "olga context.add Said after the second one tried.",
                "olga session.leave",
            ]
        );
    }

    /// A filesystem without locks is used unlocked, with a warning, as `lock` says: on Linux
    /// that is mostly NFS with no lock daemon, where flock(2) fails with ENOLCK ("No locks
    /// available"), which is no `Unsupported`: a gateway that ran on such a share stopped at
    /// start once the lock came.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_filesystem_without_locks_is_used_unlocked() {
        let enolck = std::io::Error::from_raw_os_error(nix::errno::Errno::ENOLCK as i32);
        assert!(without_locks(&enolck), "{enolck}");
        let unsupported = std::io::Error::from_raw_os_error(nix::errno::Errno::EOPNOTSUPP as i32);
        assert!(without_locks(&unsupported), "{unsupported}");
        let denied = std::io::Error::from_raw_os_error(nix::errno::Errno::EACCES as i32);
        assert!(!without_locks(&denied), "{denied}");
    }

    #[test]
    fn a_long_run_keeps_the_journal_small_and_a_restart_resends_only_the_undelivered() {
        let d = Scratch::new("compact", 16 << 10, 1 << 20);
        let (spool, resend) = d.open();
        assert!(resend.is_empty());
        let mut talk = Talk::new();
        // Alice joined long ago; Bob came and went.
        let j = talk.join("alice");
        deliver(&spool, &j);
        for e in [talk.join("bob"), talk.add("bob", "Hi."), talk.leave("bob")] {
            deliver(&spool, &e);
        }
        // 2,000 sentences delivered: about 300 KB of journal without compaction.
        let mut largest = 0;
        for i in 0..2000 {
            let e = talk.add("alice", &format!("Sentence {i} of a long day."));
            deliver(&spool, &e);
            spool.flush();
            largest = largest.max(std::fs::metadata(spool.path()).unwrap().len());
        }
        assert!(largest < 17 << 10, "the journal reached {largest} bytes");
        // Two more she said, not yet delivered when the process dies.
        for text in ["Not yet sent.", "Nor this."] {
            spool.added(&talk.add("alice", text));
        }
        drop(spool);
        let (spool, resend) = d.open();
        // Her join was compacted into a join record: she rejoins, then the two, then leaves.
        // Bob left: nothing of his.
        assert_eq!(
            summary(&resend),
            [
                "alice session.join",
                "alice context.add Not yet sent.",
                "alice context.add Nor this.",
                "alice session.leave",
            ]
        );
        // The new journal holds the resend, so another crash loses nothing either.
        drop(spool);
        let (_, again) = d.open();
        assert_eq!(summary(&again), summary(&resend));
    }

    /// Found by review bb (session 47). A compaction that failed (its new journal could not
    /// be made: a disk full for a moment) put the next attempt a threshold further on, and a
    /// compaction that then succeeded left it there: each failure raised the journal's bound
    /// for the rest of the run (64, 128, 256 MiB...), on the disk that had run short. Once a
    /// compaction succeeds the journal is compacted at its threshold again.
    #[test]
    fn a_compaction_that_failed_once_does_not_raise_the_journals_bound_for_good() {
        let d = Scratch::new("compact-again-at", 16 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("olga"));
        // The new journal cannot be made (a directory in its place): the compaction fails.
        let blocker = staging(spool.path());
        std::fs::create_dir(&blocker).unwrap();
        let mut i = 0;
        let mut say = |spool: &Spool| {
            deliver(
                spool,
                &talk.add("olga", &format!("Sentence {i} of a long day.")),
            );
            spool.flush();
            i += 1;
            std::fs::metadata(spool.path()).unwrap().len()
        };
        while say(&spool) < 17 << 10 {}
        // Room again: the next attempt, a threshold on, succeeds.
        std::fs::remove_dir(&blocker).unwrap();
        let mut last = 17 << 10;
        loop {
            let size = say(&spool);
            if size < last {
                break;
            }
            last = size;
        }
        // From then on the journal is compacted at its threshold again.
        let mut largest = 0;
        for _ in 0..1000 {
            largest = largest.max(say(&spool));
        }
        assert!(largest < 17 << 10, "the journal reached {largest} bytes");
    }

    /// Found by review bb (session 47). A compaction's new journal was made with the umask's
    /// defaults (0644), so a journal its operator had made private (`chmod 600`) was readable
    /// by every user of the host again after its first compaction. It is its owner's only.
    #[cfg(unix)]
    #[test]
    fn a_compacted_journal_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = Scratch::new("compact-mode", 4 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("pia"));
        spool.flush();
        let private = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(spool.path(), private).unwrap();
        for i in 0..100 {
            deliver(&spool, &talk.add("pia", &format!("Private sentence {i}.")));
        }
        spool.flush();
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!journal.contains("Private sentence 0."), "not compacted");
        let mode = std::fs::metadata(spool.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A name announced after the join (an RTCP NAME) survives compaction: the join record
    /// kept for a restart's rejoin carries it, though the announce itself was delivered and
    /// compacted away.
    #[test]
    fn a_compacted_join_carries_the_name_announced_since() {
        let d = Scratch::new("announce", 4 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("dora"));
        let named = json!({"id": "dora", "name": "Dora (captions)"});
        deliver(
            &spool,
            &talk.env("dora", Kind::ParticipantAnnounce, named.clone()),
        );
        for i in 0..200 {
            deliver(&spool, &talk.add("dora", &format!("Sentence {i}.")));
        }
        spool.added(&talk.add("dora", "Not yet sent."));
        spool.flush();
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!journal.contains("participant.announce"), "not compacted");
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "dora session.join",
                "dora context.add Not yet sent.",
                "dora session.leave"
            ]
        );
        assert_eq!(resend[0].to_message().payload["participant"], named);
    }

    #[test]
    fn a_participant_that_joined_again_after_leaving_keeps_its_new_join() {
        let d = Scratch::new("rejoin", 4 << 10, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        let first = talk.join("carol");
        deliver(&spool, &first);
        // Her stream ended and a new one began before the leave was written.
        let leave = talk.leave("carol");
        spool.added(&leave);
        let second = talk.join("carol");
        deliver(&spool, &second);
        spool.done(leave.id());
        // Enough delivered traffic of someone else's to compact a few times.
        let j = talk.join("dave");
        deliver(&spool, &j);
        for i in 0..200 {
            let e = talk.add("dave", &format!("Filler number {i}."));
            deliver(&spool, &e);
        }
        spool.added(&talk.add("carol", "After coming back."));
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "carol session.join",
                "carol context.add After coming back.",
                "carol session.leave",
            ]
        );
        assert_eq!(resend[0].to_message().payload, second.to_message().payload);
    }

    #[test]
    fn past_the_memory_cap_the_journal_only_grows_and_loses_nothing() {
        // Compaction due from 2 KB on, but no more than 4 KB undelivered kept in memory.
        let d = Scratch::new("cap", 2 << 10, 4 << 10);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        for who in ["erin", "frank"] {
            let j = talk.join(who);
            deliver(&spool, &j);
        }
        // Erin's connection is stuck and nothing of hers is delivered, while Frank's long
        // sentences are: most of the journal is delivered, so compacting would be due.
        let mut said = Vec::new();
        for i in 0..100 {
            let text = format!("Queued while her connection was stuck, number {i}.");
            spool.added(&talk.add("erin", &text));
            said.push(format!("erin context.add {text}"));
            let e = talk.add(
                "frank",
                &"Delivered at once, and three times as long. ".repeat(3),
            );
            deliver(&spool, &e);
        }
        spool.flush();
        let size = std::fs::metadata(spool.path()).unwrap().len();
        assert!(size > 20 << 10, "{size}");
        drop(spool);
        let (_, resend) = d.open();
        let got = summary(&resend);
        assert_eq!(got.first().map(String::as_str), Some("erin session.join"));
        assert_eq!(&got[1..101], &said[..]);
        assert_eq!(got[101..], ["erin session.leave"]);
    }

    /// The disk fills up: the journal's writes go to `/dev/full`, which fails every write with
    /// ENOSPC as a filesystem with no room does, and no new journal can be written either (its
    /// staging name is taken by a directory, so creating it fails as on a full disk). Room
    /// comes back when the returned directory is removed.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn fill_disk(spool: &Spool) -> PathBuf {
        let staging = staging(spool.path());
        std::fs::create_dir(&staging).unwrap();
        spool.swap_file(File::options().write(true).open("/dev/full").unwrap());
        staging
    }

    /// A fresh spool (no compaction due) in which `who` has joined, the join delivered.
    fn joined(name: &str, who: &str) -> (Scratch, Spool, Talk) {
        let d = Scratch::new(name, 64 << 20, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        let j = talk.join(who);
        deliver(&spool, &j);
        (d, spool, talk)
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn journal_text(spool: &Spool) -> String {
        spool.flush();
        std::fs::read_to_string(spool.path()).unwrap()
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_full_disk_is_counted_and_the_journal_is_rewritten_whole_once_there_is_room() {
        let (d, spool, mut talk) = joined("full", "grace");
        assert!(journal_text(&spool).contains("grace"));
        let staging = fill_disk(&spool);
        spool.added(&talk.add("grace", "Said while the disk was full."));
        let delivered = talk.add("grace", "Delivered while the disk was full.");
        deliver(&spool, &delivered);
        spool.flush();
        // Counted once a batch; nothing of it reached the journal, which a repair could not
        // rewrite.
        let failed = spool.write_errors();
        assert!(failed >= 1, "{failed}");
        let text = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!text.contains("disk was full"), "{text}");
        // Room again: the next batch's write still fails (the open file is the full one), and
        // the journal is rewritten whole from memory, with what the failed writes lost.
        std::fs::remove_dir(&staging).unwrap();
        spool.added(&talk.add("grace", "Said once there was room."));
        let text = journal_text(&spool);
        assert_eq!(spool.write_errors(), failed + 1);
        assert!(text.contains("Said while the disk was full."), "{text}");
        assert!(text.contains("Said once there was room."), "{text}");
        // The envelope delivered meanwhile is not in it: a restart does not send it again.
        assert!(!text.contains("Delivered while"), "{text}");
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "grace session.join",
                "grace context.add Said while the disk was full.",
                "grace context.add Said once there was room.",
                "grace session.leave",
            ]
        );
    }

    /// A write stopped short (a disk with room for part of a batch: write(2) takes what fits,
    /// then ENOSPC) leaves part of a record at the journal's end; the rewrite from memory fails
    /// too (no room for the whole journal), and the next batches, small, fit. They were
    /// written right after the torn bytes, on the torn record's line, which the next start
    /// skips whole: a kill before the rewrite succeeded lost records written whole after the
    /// failure. Here the journal's descriptor is a non-blocking socket, whose write takes what
    /// fits in its buffer and then fails (EAGAIN), and what the test reads from the other end
    /// is what the file would hold.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn records_written_after_a_write_stopped_short_survive_a_kill() {
        use std::io::Read;
        use std::os::unix::net::UnixStream;
        let (d, spool, mut talk) = joined("torn-mid", "mia");
        let mut journal = journal_text(&spool).into_bytes();
        // No rewrite succeeds (the staging name is taken, as on a full disk).
        std::fs::create_dir(staging(spool.path())).unwrap();
        let (disk, mut file) = UnixStream::pair().unwrap();
        disk.set_nonblocking(true).unwrap();
        file.set_nonblocking(true).unwrap();
        spool.swap_file(File::from(std::os::fd::OwnedFd::from(disk)));
        let mut read_all = |journal: &mut Vec<u8>| {
            let mut buf = [0; 64 << 10];
            while let Ok(n) = file.read(&mut buf) {
                journal.extend_from_slice(&buf[..n]);
            }
        };
        // More than the socket's buffer takes: the write stops short.
        spool.added(&talk.add("mia", &"Too long to fit. ".repeat(1 << 16)));
        spool.flush();
        assert_eq!(spool.write_errors(), 1);
        read_all(&mut journal);
        assert!(!journal.ends_with(b"\n"), "the write was not cut short");
        // Room again for small writes.
        spool.added(&talk.add("mia", "Written whole after the failed write."));
        spool.flush();
        read_all(&mut journal);
        assert_eq!(spool.write_errors(), 1);
        // Killed now; the next start reads what the file holds.
        let killed = d.dir.join("killed.ndjson");
        std::fs::write(&killed, &journal).unwrap();
        let plan = resend_plan(read_pending(&killed, &mut 0).unwrap(), &mut 0);
        assert_eq!(
            summary(&plan),
            [
                "mia session.join",
                "mia context.add Written whole after the failed write.",
                "mia session.leave",
            ]
        );
        std::fs::remove_dir(staging(spool.path())).unwrap();
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_journal_still_damaged_when_the_gateway_stops_is_rewritten_then() {
        let (d, spool, mut talk) = joined("stop", "ivan");
        let staging = fill_disk(&spool);
        spool.added(&talk.add("ivan", "Said as the disk filled."));
        let text = journal_text(&spool);
        assert!(!text.contains("disk filled"), "{text}");
        assert!(spool.write_errors() >= 1);
        // Room again, and nothing more is said before the gateway stops.
        std::fs::remove_dir(&staging).unwrap();
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(
            summary(&resend),
            [
                "ivan session.join",
                "ivan context.add Said as the disk filled.",
                "ivan session.leave",
            ]
        );
    }

    /// A disk that stalls: the journal's writes go into a FIFO nobody reads yet, so the writer
    /// blocks once the pipe is full, its queue fills, and handing over waits. Nothing is
    /// skipped and the order holds once the disk moves again.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_stalled_disk_makes_the_sink_wait_and_skips_nothing() {
        use std::io::Read;
        use std::sync::atomic::AtomicUsize;
        let d = Scratch::new("stall", u64::MAX, 1 << 30);
        let (spool, _) = d.open();
        let fifo = d.dir.join("stalled-disk");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Read and write: opening does not wait for a reader, and writes block when full.
        spool.swap_file(File::options().read(true).write(true).open(&fifo).unwrap());
        let mut talk = Talk::new();
        // More than the queue, a full batch (1 MiB) and the pipe (64 KiB) can hold.
        let ids: Vec<ulid::Ulid> = (0..QUEUE + (1 << 20) / 38 + (64 << 10) / 38 + 10_000)
            .map(|_| talk.add("judy", "x").id())
            .collect();
        let (spool, ids) = (std::sync::Arc::new(spool), std::sync::Arc::new(ids));
        let handed = std::sync::Arc::new(AtomicUsize::new(0));
        // Not a scoped thread: if an assertion below fails, the test must not wait for it.
        let producer = std::thread::spawn({
            let (spool, ids, handed) = (spool.clone(), ids.clone(), handed.clone());
            move || {
                for &id in ids.iter() {
                    spool.done(id);
                    handed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while !spool.behind.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "the queue never filled");
            std::thread::yield_now();
        }
        // The sink waits: it cannot have handed everything over while the disk is stalled.
        assert!(handed.load(Ordering::Relaxed) < ids.len());
        assert!(!producer.is_finished());
        // The disk moves again.
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            File::open(&fifo)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            text
        });
        producer.join().unwrap();
        spool.flush();
        assert_eq!(spool.write_errors(), 0);
        // The writer closes the FIFO as the spool goes (this is its last holder), which ends
        // the reader's read.
        drop(spool);
        let text = reader.join().unwrap();
        let written: Vec<&str> = text.lines().collect();
        let expected: Vec<String> = ids
            .iter()
            .map(|id| format!("{{\"done\":\"{id}\"}}"))
            .collect();
        assert_eq!(written.len(), expected.len());
        assert!(written.iter().zip(&expected).all(|(w, e)| w == e));
    }

    #[test]
    fn what_is_handed_over_is_written_by_the_time_the_spool_is_dropped() {
        let d = Scratch::new("drop", 64 << 20, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        spool.added(&talk.join("heidi"));
        for i in 0..1000 {
            spool.added(&talk.add("heidi", &format!("Sentence {i}.")));
        }
        drop(spool);
        let (_, resend) = d.open();
        assert_eq!(resend.len(), 1 + 1000 + 1);
    }

    /// A journal whose last record was cut short inside a multi-byte character: Linux's
    /// write(2) to a regular file stops short at a page boundary when the disk fills (ENOSPC)
    /// or a SIGKILL arrives mid-write, and transcript text is UTF-8 (accents, CJK, emoji), so
    /// the cut often falls inside a character. The module promises "a record cut short by the
    /// kill" is skipped; the gateway must still start and resend what the journal holds whole.
    #[test]
    fn a_torn_record_cut_inside_a_utf8_character_does_not_stop_the_next_start() {
        let d = Scratch::new("torn-utf8", 64 << 20, 1 << 20);
        let (spool, _) = d.open();
        let mut talk = Talk::new();
        let j = talk.join("kim");
        deliver(&spool, &j);
        spool.added(&talk.add("kim", "Undelivered, journaled whole."));
        spool.added(&talk.add("kim", "Café, 日本語 und Grüße: cut short by the kill."));
        spool.flush();
        drop(spool);
        // The last record is torn in the middle of "日" (3 bytes: E6 97 A5), as a short write
        // leaves it.
        let path = d.dir.join("journal.ndjson");
        let bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(3)
            .rposition(|w| w == "日".as_bytes())
            .unwrap();
        std::fs::write(&path, &bytes[..at + 1]).unwrap();
        // The gateway starts, skipping the torn record, and resends the whole one.
        let (_, resend) = Spool::open_with(&d.dir, d.compact_at, d.live_cap, Counter::default())
            .expect("a torn last record must not stop the gateway from starting");
        assert_eq!(
            summary(&resend),
            [
                "kim session.join",
                "kim context.add Undelivered, journaled whole.",
                "kim session.leave",
            ]
        );
    }

    /// A journal damaged or written by hand whose join record's payload is no object (then an
    /// announce of the same participant) made the start panic, indexing that payload: the
    /// gateway could not start. Such a join is no join to rejoin with; the text is resent.
    #[test]
    fn a_join_record_whose_payload_is_no_object_does_not_stop_the_next_start() {
        let d = Scratch::new("garbage-join", 64 << 20, 1 << 20);
        let journal = [
            r#"{"add":{"v":1,"id":"01JAAAAAAAAAAAAAAAAAAAAAA1","ts":"2026-01-01T00:00:00.000Z","session":"s","sender":"p","type":"session.join","payload":"garbage"}}"#,
            r#"{"add":{"v":1,"id":"01JAAAAAAAAAAAAAAAAAAAAAA2","ts":"2026-01-01T00:00:00.000Z","session":"s","sender":"p","type":"participant.announce","payload":{"id":"p","name":"P","type":"human","roles":[],"transport":"t140"}}}"#,
            r#"{"add":{"v":1,"id":"01JAAAAAAAAAAAAAAAAAAAAAA3","ts":"2026-01-01T00:00:00.000Z","session":"s","sender":"p","type":"context.add","payload":{"key":"k","content":"Still wanted.","content_type":"audio_transcript"}}}"#,
        ]
        .join("\n")
            + "\n";
        std::fs::create_dir_all(&d.dir).unwrap();
        std::fs::write(d.dir.join("journal.ndjson"), journal).unwrap();
        let (_, resend) = Spool::open_with(&d.dir, d.compact_at, d.live_cap, Counter::default())
            .expect("a malformed record must not stop the gateway from starting");
        assert!(
            summary(&resend).contains(&"p context.add Still wanted.".to_owned()),
            "{:?}",
            summary(&resend)
        );
    }

    /// `name`, empty, on the small tmpfs `PVP_T140_SMALL_FS` names, for one test at a time
    /// (the tests fill it).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn small_fs(name: &str) -> (std::sync::MutexGuard<'static, ()>, PathBuf) {
        static SMALL_FS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let guard = SMALL_FS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fs = std::env::var_os("PVP_T140_SMALL_FS")
            .expect("PVP_T140_SMALL_FS: an empty directory on a 64 KiB tmpfs");
        let dir = PathBuf::from(fs).join(name);
        let _ = std::fs::remove_dir_all(&dir);
        (guard, dir)
    }

    /// Fills the disk under `dir` but for `pages` free pages, with `dir/filler`.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn fill_but(dir: &Path, pages: u64) -> PathBuf {
        let filler = dir.join("filler");
        let mut f = File::create(&filler).unwrap();
        let page = [0u8; 4096];
        while f.write_all(&page).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(pages * 4096) / 4096 * 4096)
            .unwrap();
        f.sync_all().unwrap();
        filler
    }

    /// A compaction on a nearly full disk fails writing the new journal, and left it behind,
    /// half written: it held the disk's last free pages until the next attempt (a second
    /// later for a repair; the next threshold for a compaction), so the journal's own appends,
    /// which would have fit, failed too and what they held was lost to a kill. A failed
    /// rewrite removes what it wrote.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    #[ignore = "needs a 64 KiB tmpfs named by PVP_T140_SMALL_FS; .ci/run mounts one and runs this"]
    fn a_compaction_failed_on_a_full_disk_leaves_no_new_journal_behind() {
        let (_fs, dir) = small_fs("compact");
        let (spool, _) = Spool::open_with(&dir, 16 << 10, 1 << 20, Counter::default()).unwrap();
        let mut talk = Talk::new();
        deliver(&spool, &talk.join("nina"));
        // About 6 KiB undelivered, which a compaction keeps: two pages.
        for i in 0..25 {
            spool.added(&talk.add("nina", &format!("Undelivered, kept, number {i:03}.")));
        }
        // Delivered traffic, the journal just short of the threshold.
        let mut i = 0;
        while std::fs::metadata(spool.path()).map_or(0, |m| m.len()) < 15 << 10 {
            deliver(
                &spool,
                &talk.add("nina", &format!("Delivered, number {i:03}.")),
            );
            spool.flush();
            i += 1;
        }
        // Two pages free: one for the journal to grow into, one for part of a new journal.
        let filler = fill_but(&dir, 2);
        while std::fs::metadata(spool.path()).unwrap().len() < 16 << 10 {
            deliver(&spool, &talk.add("nina", "Delivered past the threshold."));
            spool.flush();
        }
        let journal = std::fs::read_to_string(spool.path()).unwrap();
        assert!(journal.contains("Delivered, number 000."), "compacted");
        let left = std::fs::metadata(staging(spool.path())).map(|m| m.len());
        // The journal goes on into the page the new journal had (5 KiB more).
        for _ in 0..25 {
            deliver(
                &spool,
                &talk.add("nina", "Delivered after the failed compaction."),
            );
            spool.flush();
        }
        let failed = spool.write_errors();
        drop(spool);
        std::fs::remove_file(&filler).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(left.is_err(), "a new journal left behind: {left:?} bytes");
        assert_eq!(failed, 0, "the journal's writes failed");
    }

    /// The same with a real full disk: `PVP_T140_SMALL_FS` names an empty directory on a
    /// small tmpfs (`mount -t tmpfs -o size=64k tmpfs DIR`, as root; `.ci/run` does so). The
    /// journal's write(2) stops short at a page boundary with ENOSPC, inside a character of
    /// the transcript; the disk is still full when the gateway stops, so the journal stays
    /// torn; room comes back, and the gateway must start.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    #[ignore = "needs a 64 KiB tmpfs named by PVP_T140_SMALL_FS; .ci/run mounts one and runs this"]
    fn a_write_torn_by_a_full_disk_does_not_stop_the_next_start() {
        let (_fs, dir) = small_fs("spool");
        let (spool, _) = Spool::open_with(&dir, 64 << 20, 1 << 20, Counter::default()).unwrap();
        let mut talk = Talk::new();
        let j = talk.join("lea");
        deliver(&spool, &j);
        spool.flush();
        let size = std::fs::metadata(spool.path()).unwrap().len() as usize;
        assert!(size < 4096);
        // The disk fills up, all but one page.
        let filler = dir.join("filler");
        {
            let mut f = File::create(&filler).unwrap();
            let page = [0u8; 4096];
            while f.write_all(&page).is_ok() {}
            f.set_len(f.metadata().unwrap().len() - 4096).unwrap();
            f.sync_all().unwrap();
        }
        // Three pages of Japanese, padded so that the write stops (at file offset 8192: the
        // journal's first page and the free one) inside a character.
        let probe = talk.add("lea", "");
        let prefix = add_record(&probe).find("\"content\":\"").unwrap() + 11;
        let to_cut = 8192 - size - prefix;
        let pad = "x".repeat((to_cut + 2) % 3);
        let text = format!("{pad}{}", "日本語".repeat(1400));
        spool.added(&talk.add("lea", &text));
        spool.flush();
        drop(spool);
        let bytes = std::fs::read(dir.join("journal.ndjson")).unwrap();
        assert_eq!(
            bytes.len(),
            8192,
            "the write stopped short at the page boundary"
        );
        assert!(
            std::str::from_utf8(&bytes).is_err(),
            "torn inside a character"
        );
        // Room again; the gateway restarts.
        std::fs::remove_file(&filler).unwrap();
        let opened = Spool::open_with(&dir, 64 << 20, 1 << 20, Counter::default());
        let _ = std::fs::remove_dir_all(&dir);
        let (_, resend) =
            opened.expect("a journal torn by a full disk must not stop the gateway from starting");
        assert_eq!(summary(&resend), Vec::<String>::new());
    }

    /// The writer thread gone (ended unasked): every record after it was logged at error
    /// level, a line a record, as often as text came. Now the first is logged, and each is
    /// still counted.
    #[test]
    fn a_writer_gone_is_logged_once_and_every_record_counted() {
        let (_d, mut spool, mut talk) = joined("gone", "hana");
        spool.flush();
        let before = spool.write_errors();
        // The writer's own sender dropped (it ends), in its place one nobody receives from.
        let (tx, rx) = mpsc::sync_channel(1);
        drop(rx);
        spool.tx = Some(tx);
        let logged = crate::said::Logged::default();
        let _log = tracing::subscriber::set_default(logged.subscriber(tracing::Level::INFO));
        for i in 0..100 {
            spool.added(&talk.add("hana", &format!("Said {i}.")));
        }
        assert_eq!(spool.write_errors() - before, 100);
        let text = logged.text();
        let lines = text
            .lines()
            .filter(|l| l.contains("spool writer gone"))
            .count();
        assert_eq!(lines, 1, "{text}");
    }
}
