//! Review aj: the `--spool DIR` delivery journal, through the public `Spool::open` (the
//! thresholds a running gateway has: compaction at 64 MiB) and the real binary.

use std::path::PathBuf;

use prometheus_client::metrics::counter::Counter;
use pvp_t140::Time;
use pvp_t140::pvp::{Builder, Envelope, Kind, SenderId};
use pvp_t140::sink::spool::Spool;
use serde_json::{Value, json};

/// A spool directory of its own, removed afterwards.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d =
            std::env::temp_dir().join(format!("pvp-t140-review-aj-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn journal(&self) -> PathBuf {
        self.0.join("journal.ndjson")
    }
    fn open(&self) -> (Spool, Vec<Envelope>) {
        Spool::open(&self.0, Counter::default()).unwrap()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Talk {
    b: Builder,
    t: u64,
}

impl Talk {
    fn new(session: &str) -> Self {
        Talk {
            b: Builder::new(session.into(), None, 7),
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
    fn join(&mut self, who: &str, name: &str) -> Envelope {
        self.env(
            who,
            Kind::SessionJoin,
            json!({"participant": {"id": who, "name": name}}),
        )
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

fn said_by(plan: &[Envelope], who: &str) -> Vec<String> {
    plan.iter()
        .map(|e| e.to_message())
        .filter(|m| m.sender == who)
        .map(|m| {
            let detail = m
                .payload
                .get("content")
                .or_else(|| m.payload.get("participant").and_then(|p| p.get("name")))
                .and_then(Value::as_str)
                .unwrap_or("");
            format!("{} {} {detail}", m.sender, m.kind)
                .trim_end()
                .to_owned()
        })
        .collect()
}

/// Someone else's delivered traffic, 1 MiB a chunk, past the 64 MiB a running gateway
/// compacts at: the journal is compacted.
fn compact_with_filler(d: &Dir, spool: &Spool, talk: &mut Talk) {
    deliver(spool, &talk.join("bob", "Bob"));
    let big = "x".repeat(1 << 20);
    for _ in 0..70 {
        deliver(spool, &talk.add("bob", &big));
    }
    deliver(spool, &talk.leave("bob"));
    spool.flush();
    let size = std::fs::metadata(d.journal()).unwrap().len();
    assert!(size < 8 << 20, "not compacted: {size} bytes");
}

/// README: text a `RATE_LIMITED` names, read after the participant's leave was written (what
/// a restart's resend always meets: its leave goes right behind its text), is "undelivered
/// again in the journal, so the next start sends it", its participant rejoining first. The
/// leave's mark dropped the participant's join from what a compaction keeps; a compaction
/// before the next start then left the text with no join to rejoin with, and the next start
/// sent it first on a connection with no join (pvp-spec 6.3: the server refuses it).
#[test]
fn text_refused_after_the_leave_keeps_its_rejoin_through_a_compaction() {
    let d = Dir::new("late-compact");
    let (spool, _) = d.open();
    let mut talk = Talk::new("s");
    deliver(&spool, &talk.join("alice", "Alice"));
    let text = talk.add("alice", "Refused after the leave was written.");
    deliver(&spool, &text);
    deliver(&spool, &talk.leave("alice"));
    // The RATE_LIMITED naming the text is read after the leave was written.
    spool.again(&text);
    spool.flush();
    // The gateway runs on; the journal grows and is compacted.
    compact_with_filler(&d, &spool, &mut talk);
    // Killed; the next start.
    drop(spool);
    let (_, plan) = d.open();
    assert_eq!(
        said_by(&plan, "alice"),
        [
            "alice session.join Alice",
            "alice context.add Refused after the leave was written.",
            "alice session.leave",
        ]
    );
}
