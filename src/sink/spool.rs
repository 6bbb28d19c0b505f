//! `--spool DIR`: an append-only journal of what the PVP sink was given and what it wrote, so a
//! gateway killed with SIGKILL resends, on restart, exactly what it had not yet written — and
//! nothing it had.
//!
//! `journal.ndjson` holds one JSON record a line: `{"add":ENVELOPE}` when an envelope enters the
//! sink (before any attempt to send it), `{"done":"ID"}` once its frame is written to the
//! socket. Records are written with `write(2)` as they happen, so they survive the process
//! being killed (not a power cut: there is no fsync per record). On start the journal is read,
//! the envelopes without `done` are handed to the sink again (each participant rejoins first
//! and leaves after, since its stream is gone), and the journal starts over with just those.
//! While running, a journal grown large is rewritten the same way (`COMPACT_AT`), with
//! `{"join":ENVELOPE}` records keeping each present participant's join for a rejoin.
//! A frame written in the instant before a kill, before its `done` record, is sent twice: the
//! delivery is at least once, with that window as the only duplicate.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
    journal: Mutex<Journal>,
    /// Records that could not be written (disk full, I/O error): logged loudly, counted.
    pub write_errors: std::sync::atomic::AtomicU64,
}

/// The open journal, and what a compaction keeps of it: the envelopes not yet written to the
/// server, in order, and the latest join of every participant that has not left (a restart
/// rejoins with it before resending).
#[derive(Debug)]
struct Journal {
    file: File,
    /// Bytes in the journal file.
    size: u64,
    compact_at: u64,
    live_cap: u64,
    /// Order of the next envelope added.
    next: u64,
    /// Undelivered envelopes by order: their `add` records, and for a leave, whose.
    live: BTreeMap<u64, Live>,
    order: HashMap<ulid::Ulid, u64>,
    live_bytes: u64,
    /// Each participant's latest join as a `join` record, with the join's order.
    joins: HashMap<SenderId, (u64, String)>,
    joins_bytes: u64,
    /// Past `live_cap`: compacting stopped for this run (see [`LIVE_CAP`]).
    untracked: bool,
}

#[derive(Debug)]
struct Live {
    record: String,
    leave_of: Option<SenderId>,
}

impl Spool {
    /// Opens (creating) `dir/journal.ndjson` and returns the envelopes it had not delivered,
    /// in order, ready to be handed to the sink again. The journal is rewritten to hold only
    /// those, so a crash during the resend loses nothing either.
    pub fn open(dir: &Path) -> Result<(Spool, Vec<Envelope>), String> {
        Self::open_with(dir, COMPACT_AT, LIVE_CAP)
    }

    fn open_with(
        dir: &Path,
        compact_at: u64,
        live_cap: u64,
    ) -> Result<(Spool, Vec<Envelope>), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("--spool {}: {e}", dir.display()))?;
        let path = dir.join("journal.ndjson");
        let pending = resend_plan(read_pending(&path)?);
        let tmp = staging(&path);
        let err = |e: std::io::Error| format!("--spool {}: {e}", tmp.display());
        // The resend is journaled as it would be when added, in a new journal that replaces
        // the old one once whole and synced.
        let mut journal = Journal {
            file: File::create(&tmp).map_err(err)?,
            size: 0,
            compact_at,
            live_cap,
            next: 0,
            live: BTreeMap::new(),
            order: HashMap::new(),
            live_bytes: 0,
            joins: HashMap::new(),
            joins_bytes: 0,
            untracked: false,
        };
        for e in &pending {
            journal.add(e).map_err(err)?;
        }
        journal.file.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("--spool {}: {e}", path.display()))?;
        let spool = Spool {
            path,
            journal: Mutex::new(journal),
            write_errors: Default::default(),
        };
        Ok((spool, pending))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, e: &std::io::Error) {
        self.write_errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(path = %self.path.display(), "spool write failed ({e}): this envelope would not survive a crash");
    }

    /// Before an envelope is sent.
    pub fn added(&self, e: &Envelope) {
        let mut j = self.journal();
        if let Err(err) = j.add(e) {
            self.failed(&err);
        }
        self.compact_if_due(&mut j);
    }

    /// Once its frame is written to the socket.
    pub fn done(&self, id: ulid::Ulid) {
        let mut j = self.journal();
        if let Err(err) = j.done(id) {
            self.failed(&err);
        }
        self.compact_if_due(&mut j);
    }

    fn compact_if_due(&self, j: &mut Journal) {
        if j.untracked || j.size < j.compact_at || j.kept_bytes() > j.size / 2 {
            return;
        }
        let (before, started) = (j.size, std::time::Instant::now());
        match j.compact(&self.path) {
            Ok(()) => {
                tracing::info!(path = %self.path.display(), before, after = j.size, took = ?started.elapsed(), "spool journal compacted")
            }
            Err(e) => {
                // The old journal is still whole and still appended to: nothing is lost,
                // it only stays large. Tried again at the next threshold.
                j.compact_at = j.size.saturating_add(j.compact_at);
                tracing::error!(path = %self.path.display(), "spool journal not compacted ({e}); it keeps growing");
            }
        }
    }
}

impl Journal {
    fn write(&mut self, record: &str) -> std::io::Result<()> {
        self.file.write_all(record.as_bytes())?;
        self.size += record.len() as u64;
        Ok(())
    }

    fn add(&mut self, e: &Envelope) -> std::io::Result<()> {
        let record = add_record(e);
        let written = self.write(&record);
        if self.untracked {
            return written;
        }
        let n = self.next;
        self.next += 1;
        if e.kind() == Kind::SessionJoin {
            let join = format!("{{\"join\":{}}}\n", e.json());
            self.joins_bytes += join.len() as u64;
            if let Some((_, old)) = self.joins.insert(e.sender().clone(), (n, join)) {
                self.joins_bytes -= old.len() as u64;
            }
        }
        let leave_of = (e.kind() == Kind::SessionLeave).then(|| e.sender().clone());
        self.live_bytes += record.len() as u64;
        self.order.insert(e.id(), n);
        self.live.insert(n, Live { record, leave_of });
        if self.live_bytes > self.live_cap {
            tracing::warn!(
                undelivered_bytes = self.live_bytes,
                "spool: too much undelivered to compact the journal in memory; it grows until the next start"
            );
            self.untracked = true;
            self.live = BTreeMap::new();
            self.order = HashMap::new();
            self.joins = HashMap::new();
        }
        written
    }

    fn done(&mut self, id: ulid::Ulid) -> std::io::Result<()> {
        let written = self.write(&format!("{{\"done\":\"{id}\"}}\n"));
        if let Some(n) = self.order.remove(&id)
            && let Some(l) = self.live.remove(&n)
        {
            self.live_bytes -= l.record.len() as u64;
            // Left: a restart will not need its join, unless it joined again since.
            if let Some(who) = l.leave_of
                && self.joins.get(&who).is_some_and(|(at, _)| *at < n)
                && let Some((_, old)) = self.joins.remove(&who)
            {
                self.joins_bytes -= old.len() as u64;
            }
        }
        written
    }

    /// Bytes a compaction would write.
    fn kept_bytes(&self) -> u64 {
        self.live_bytes + self.joins_bytes
    }

    /// Rewrites the journal with only what a restart needs: each participant's latest join
    /// (as a `join` record, never resent itself) and the undelivered envelopes in order. The
    /// new file replaces the old one only once it is whole; until then, and if anything fails,
    /// the old one is kept and appended to. Not synced: like every record, it is to survive the
    /// process, not a power cut, and a sync here stalled the connections' thread (a 2,000
    /// participant run's worst latency went from 18 to 80 ms).
    fn compact(&mut self, path: &Path) -> std::io::Result<()> {
        let tmp = staging(path);
        let mut out = std::io::BufWriter::with_capacity(64 << 10, File::create(&tmp)?);
        let mut size = 0;
        let joins = self.joins.values().map(|(_, r)| r);
        for r in joins.chain(self.live.values().map(|l| &l.record)) {
            out.write_all(r.as_bytes())?;
            size += r.len() as u64;
        }
        let file = out
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        std::fs::rename(&tmp, path)?;
        // The handle written through is the journal now; it goes on at its end. Closing the
        // old one frees the replaced file, tens of MB: done on a thread of its own, so as not to
        // stall the connections' thread.
        let old = std::mem::replace(&mut self.file, file);
        if std::thread::Builder::new()
            .name("spool-free".into())
            .spawn(move || drop(old))
            .is_err()
        {
            tracing::debug!("spool: no thread to close the old journal; closed here");
        }
        self.size = size;
        Ok(())
    }
}

/// Where a new journal is written before it replaces `path`, whole.
fn staging(path: &Path) -> PathBuf {
    path.with_extension("ndjson.new")
}

/// A journal line recording an envelope about to be sent.
fn add_record(e: &Envelope) -> String {
    format!("{{\"add\":{}}}\n", e.json())
}

/// The undelivered envelopes, and the last join of every sender (delivered or not).
fn read_pending(path: &Path) -> Result<(Vec<Message>, HashMap<String, Message>), String> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(format!("--spool {}: {e}", path.display())),
    };
    let mut adds: Vec<Message> = Vec::new();
    let mut joins: HashMap<String, Message> = HashMap::new();
    let mut done: HashSet<String> = HashSet::new();
    for (n, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("--spool {}: {e}", path.display()))?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            // A record cut short by the kill: the last line may be partial.
            tracing::warn!(path = %path.display(), line = n + 1, "skipping an incomplete journal record");
            continue;
        };
        if let Some(id) = v.get("done").and_then(Value::as_str) {
            done.insert(id.to_owned());
        } else if let Some(j) = v
            .get("join")
            .and_then(|e| serde_json::from_value::<Message>(e.clone()).ok())
        {
            // A compacted journal's copy of a join: for rejoining, never resent itself.
            joins.insert(j.sender.clone(), j);
        } else if let Some(e) = v
            .get("add")
            .and_then(|e| serde_json::from_value::<Message>(e.clone()).ok())
        {
            if e.kind == "session.join" {
                joins.insert(e.sender.clone(), e.clone());
            }
            adds.push(e);
        }
    }
    Ok((
        adds.into_iter().filter(|e| !done.contains(&e.id)).collect(),
        joins,
    ))
}

/// What to send after a restart: per participant, in the journal's order, a fresh join (its
/// old connection is gone; a new one is bound by its first frame), the undelivered envelopes,
/// and a leave (its stream went down with the old process), unless they are already there.
fn resend_plan((pending, joins): (Vec<Message>, HashMap<String, Message>)) -> Vec<Envelope> {
    let mut ids = crate::pvp::IdGen::new(crate::clock::random_seed());
    let now = crate::time::Time::from_system(std::time::SystemTime::now());
    let mut order: Vec<String> = Vec::new();
    let mut by_sender: HashMap<String, Vec<Message>> = HashMap::new();
    for e in pending {
        if !by_sender.contains_key(&e.sender) {
            order.push(e.sender.clone());
        }
        by_sender.entry(e.sender.clone()).or_default().push(e);
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
        if list.first().is_none_or(|e| e.kind != "session.join") {
            match joins.get(&sender) {
                Some(j) => {
                    let mut j = j.clone();
                    j.id = ids.next(now).to_string();
                    j.ts = now.to_iso8601();
                    out.push(j);
                }
                None => {
                    tracing::warn!(%sender, "undelivered envelopes without a join in the journal: sending them anyway")
                }
            }
        }
        let ends_with_leave = list.last().is_some_and(|e| e.kind == "session.leave");
        let template = list.last().cloned();
        out.extend(list);
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
                .map_err(|e| tracing::warn!("journal record not re-sent: {e}"))
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
            Spool::open_with(&self.dir, self.compact_at, self.live_cap).unwrap()
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
        let size = std::fs::metadata(spool.path()).unwrap().len();
        assert!(size > 20 << 10, "{size}");
        drop(spool);
        let (_, resend) = d.open();
        let got = summary(&resend);
        assert_eq!(got.first().map(String::as_str), Some("erin session.join"));
        assert_eq!(&got[1..101], &said[..]);
        assert_eq!(got[101..], ["erin session.leave"]);
    }
}
