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
//! A frame written in the instant before a kill, before its `done` record, is sent twice: the
//! delivery is at least once, with that window as the only duplicate.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::pvp::{Envelope, Message};

#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
    file: Mutex<File>,
    /// Records that could not be written (disk full, I/O error): logged loudly, counted.
    pub write_errors: std::sync::atomic::AtomicU64,
}

impl Spool {
    /// Opens (creating) `dir/journal.ndjson` and returns the envelopes it had not delivered,
    /// in order, ready to be handed to the sink again. The journal is rewritten to hold only
    /// those, so a crash during the resend loses nothing either.
    pub fn open(dir: &Path) -> Result<(Spool, Vec<Envelope>), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("--spool {}: {e}", dir.display()))?;
        let path = dir.join("journal.ndjson");
        let pending = resend_plan(read_pending(&path)?);
        let tmp = dir.join("journal.ndjson.new");
        {
            let mut f =
                File::create(&tmp).map_err(|e| format!("--spool {}: {e}", tmp.display()))?;
            for e in &pending {
                f.write_all(add_record(e).as_bytes())
                    .map_err(|e| format!("--spool {}: {e}", tmp.display()))?;
            }
            f.sync_all()
                .map_err(|e| format!("--spool {}: {e}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| format!("--spool {}: {e}", path.display()))?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| format!("--spool {}: {e}", path.display()))?;
        let spool = Spool {
            path,
            file: Mutex::new(file),
            write_errors: Default::default(),
        };
        Ok((spool, pending))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, line: &str) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            self.write_errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(path = %self.path.display(), "spool write failed ({e}): this envelope would not survive a crash");
        }
    }

    /// Before an envelope is sent.
    pub fn added(&self, e: &Envelope) {
        self.write(&add_record(e));
    }

    /// Once its frame is written to the socket.
    pub fn done(&self, id: ulid::Ulid) {
        self.write(&format!("{{\"done\":\"{id}\"}}\n"));
    }
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
