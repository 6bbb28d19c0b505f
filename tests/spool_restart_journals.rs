//! The `--spool DIR` journal as a restarted gateway reads it (hand-made journals:
//! damaged, foreign, left by a kill at an awkward moment), through the public `Spool::open`.

use std::path::{Path, PathBuf};

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
            std::env::temp_dir().join(format!("pvp-t140-review-s-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn journal(&self) -> PathBuf {
        self.0.join("journal.ndjson")
    }
    fn open(&self) -> Vec<Envelope> {
        let (spool, plan) = Spool::open(&self.0, Counter::default()).unwrap();
        drop(spool);
        plan
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
    fn announce(&mut self, who: &str, name: &str) -> Envelope {
        self.env(
            who,
            Kind::ParticipantAnnounce,
            json!({"id": who, "name": name}),
        )
    }
    fn add(&mut self, who: &str, text: &str) -> Envelope {
        self.env(who, Kind::ContextAdd, json!({"content": text}))
    }
    fn leave(&mut self, who: &str) -> Envelope {
        self.env(who, Kind::SessionLeave, json!({"reason": "bye"}))
    }
}

/// A journal record as the gateway writes it: `add` with an order.
fn add(e: &Envelope, n: u64) -> String {
    format!("{{\"add\":{},\"n\":{n}}}\n", e.json())
}

fn done(e: &Envelope) -> String {
    format!("{{\"done\":\"{}\"}}\n", e.id())
}

fn summary(plan: &[Envelope]) -> Vec<String> {
    plan.iter()
        .map(|e| {
            let m = e.to_message();
            let detail = m
                .payload
                .get("content")
                .or_else(|| m.payload.get("participant").and_then(|p| p.get("name")))
                .or_else(|| m.payload.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            format!("{} {} {} {detail}", m.session, m.sender, m.kind)
                .trim_end()
                .to_owned()
        })
        .collect()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// A participant with one sentence undelivered, as a journal: join (written), the sentence.
fn one_undelivered(t: &mut Talk) -> String {
    let j = t.join("a", "Ann");
    let x = t.add("a", "Hello.");
    [add(&j, 0), done(&j), add(&x, 1)].concat()
}

const PLAN: [&str; 3] = [
    "s a session.join Ann",
    "s a context.add Hello.",
    "s a session.leave",
];

#[test]
fn crlf_line_ends_are_read_like_lf() {
    let d = Dir::new("crlf");
    let mut t = Talk::new("s");
    write(&d.journal(), &one_undelivered(&mut t).replace('\n', "\r\n"));
    assert_eq!(summary(&d.open()), PLAN);
}

#[test]
fn a_torn_last_line_is_skipped() {
    let d = Dir::new("torn");
    let mut t = Talk::new("s");
    let more = t.add("a", "Cut short é");
    let line = add(&more, 2);
    // Inside the two bytes of the é.
    let cut = line.find('é').unwrap() + 1;
    let mut bytes = one_undelivered(&mut t).into_bytes();
    bytes.extend_from_slice(&line.as_bytes()[..cut]);
    std::fs::write(d.journal(), bytes).unwrap();
    assert_eq!(summary(&d.open()), PLAN);
    // The journal was rewritten whole: a second start reads the same.
    assert_eq!(summary(&d.open()), PLAN);
}

/// Lines of valid JSON that are no records (a journal edited by hand, or by another tool)
/// for a participant whose every envelope was delivered: nothing to send, no stray join or
/// leave.
#[test]
fn json_that_is_no_record_sends_nothing() {
    let d = Dir::new("nonrecord");
    let mut t = Talk::new("s");
    let j = t.join("a", "Ann");
    let x = t.add("a", "Hello.");
    let mut odd = x.to_message();
    odd.kind = "chat.message".into();
    odd.id = "01ARZ3NDEKTSV4RRFFQ69G5FAZ".into();
    let mut bad_id = x.to_message();
    bad_id.id = "not-a-ulid".into();
    let text = [
        add(&j, 0),
        done(&j),
        add(&x, 1),
        done(&x),
        "{}\n".into(),
        "[]\n".into(),
        "\"x\"\n".into(),
        "{\"done\":5}\n".into(),
        "{\"add\":{}}\n".into(),
        "{\"add\":null}\n".into(),
        format!("{{\"add\":{},\"n\":2}}\n", odd.to_json()),
        format!("{{\"add\":{},\"n\":3}}\n", bad_id.to_json()),
    ]
    .concat();
    write(&d.journal(), &text);
    assert_eq!(summary(&d.open()), Vec::<String>::new());
}

#[test]
fn a_staging_file_left_by_a_kill_mid_compaction_is_ignored_and_replaced() {
    let d = Dir::new("staging");
    let mut t = Talk::new("s");
    write(&d.journal(), &one_undelivered(&mut t));
    // A compaction's new journal, half written when the kill came.
    let other = t.add("a", "Never journaled.");
    write(
        &d.0.join("journal.ndjson.new"),
        &add(&other, 0)[..add(&other, 0).len() / 2],
    );
    assert_eq!(summary(&d.open()), PLAN);
    assert!(!d.0.join("journal.ndjson.new").exists());
}

#[test]
fn a_dir_that_is_a_file_is_an_error_naming_it() {
    let d = Dir::new("dirfile");
    let file = d.0.join("plain");
    write(&file, "x");
    let err = Spool::open(&file, Counter::default()).unwrap_err();
    assert!(err.contains("--spool") && err.contains("plain"), "{err}");
}

#[test]
fn a_read_only_journal_is_read_and_replaced() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dir::new("readonly");
    let mut t = Talk::new("s");
    write(&d.journal(), &one_undelivered(&mut t));
    std::fs::set_permissions(d.journal(), std::fs::Permissions::from_mode(0o444)).unwrap();
    assert_eq!(summary(&d.open()), PLAN);
}

#[test]
fn nothing_undelivered_sends_nothing() {
    let d = Dir::new("nothing");
    let mut t = Talk::new("s");
    let j = t.join("a", "Ann");
    let x = t.add("a", "Hello.");
    let l = t.leave("a");
    let k = t.join("b", "Bob");
    let y = t.add("b", "Hi.");
    let text = [
        add(&j, 0),
        add(&x, 1),
        add(&k, 2),
        done(&j),
        done(&x),
        add(&y, 3),
        add(&l, 4),
        done(&k),
        done(&y),
        done(&l),
    ]
    .concat();
    write(&d.journal(), &text);
    assert_eq!(summary(&d.open()), Vec::<String>::new());
    assert_eq!(std::fs::read_to_string(d.journal()).unwrap(), "");
}

/// A restart killed before it resent anything: the next start sends the same, once.
#[test]
fn a_restart_killed_before_resending_is_resent_once_by_the_next() {
    let d = Dir::new("twice");
    let mut t = Talk::new("s");
    write(&d.journal(), &one_undelivered(&mut t));
    let first = d.open();
    assert_eq!(summary(&first), PLAN);
    let second = d.open();
    assert_eq!(summary(&second), PLAN);
    let ids = |p: &[Envelope]| p.iter().map(Envelope::id).collect::<Vec<_>>();
    assert_eq!(ids(&first), ids(&second));
    // Killed after the rejoin and the sentence were written, before the leave: the third
    // start rejoins and leaves, and says nothing twice.
    let mut text = std::fs::read_to_string(d.journal()).unwrap();
    text.push_str(&done(&second[0]));
    text.push_str(&done(&second[1]));
    write(&d.journal(), &text);
    assert_eq!(
        summary(&d.open()),
        ["s a session.join Ann", "s a session.leave"]
    );
}

/// Left, then joined again under another name, then said something not delivered: the
/// restart rejoins under the latest name, once.
#[test]
fn a_participant_that_left_and_rejoined_rejoins_under_its_latest_name() {
    let d = Dir::new("rejoined");
    let mut t = Talk::new("s");
    let j = t.join("a", "Ann");
    let an = t.announce("a", "Anna");
    let l = t.leave("a");
    let k = t.join("a", "Anne");
    let x = t.add("a", "Back.");
    let text = [
        add(&j, 0),
        done(&j),
        add(&an, 1),
        done(&an),
        add(&l, 2),
        done(&l),
        add(&k, 3),
        done(&k),
        add(&x, 4),
    ]
    .concat();
    write(&d.journal(), &text);
    assert_eq!(
        summary(&d.open()),
        [
            "s a session.join Anne",
            "s a context.add Back.",
            "s a session.leave"
        ]
    );
}

/// Two participants of the same name (two SSRCs, one display name), and one id in two
/// sessions: each keeps its own rejoin.
#[test]
fn same_names_and_same_ids_in_two_sessions_are_kept_apart() {
    let d = Dir::new("samename");
    let mut t = Talk::new("s");
    let mut u = Talk::new("other");
    u.t = 1_700_000_000_500;
    let ja = t.join("a", "Sam");
    let jb = t.join("b", "Sam");
    let ja2 = u.join("a", "Al");
    let xa = t.add("a", "From a.");
    let xb = t.add("b", "From b.");
    let xa2 = u.add("a", "From a elsewhere.");
    let text = [
        add(&ja, 0),
        add(&jb, 1),
        add(&ja2, 2),
        done(&ja),
        done(&jb),
        done(&ja2),
        add(&xa, 3),
        add(&xb, 4),
        add(&xa2, 5),
    ]
    .concat();
    write(&d.journal(), &text);
    assert_eq!(
        summary(&d.open()),
        [
            "s a session.join Sam",
            "s a context.add From a.",
            "s a session.leave",
            "s b session.join Sam",
            "s b context.add From b.",
            "s b session.leave",
            "other a session.join Al",
            "other a context.add From a elsewhere.",
            "other a session.leave",
        ]
    );
}

/// A journal written under another `--session` is resent to the session it was said in.
#[test]
fn a_journal_of_another_session_is_resent_to_its_own() {
    let d = Dir::new("othersession");
    let mut t = Talk::new("old-room");
    write(&d.journal(), &one_undelivered(&mut t));
    let plan = d.open();
    assert!(summary(&plan).iter().all(|l| l.starts_with("old-room ")));
    assert!(plan.iter().all(|e| e.session_json() == "old-room"));
}

#[path = "common/ws_rate.rs"]
mod ws_rate;

/// A restart's resend whose text the server refuses as RATE_LIMITED (a burst after an outage
/// is what a rate limit catches) or PARTICIPANT_NOT_FOUND: the text must reach the server after
/// the pause, or stay undelivered in the journal for the next start, and not both. The resend
/// writes the participant's leave right behind its text, so the refusal is read after the leave
/// (review s: the text was lost, neither sent again nor left in the journal).
async fn resent_text_refused_as(code: &'static str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let d = Dir::new(&format!("resend-{code}"));
    let mut t = Talk::new("s");
    write(&d.journal(), &one_undelivered(&mut t));
    let (spool, plan) = Spool::open(&d.0, Counter::default()).unwrap();
    assert_eq!(summary(&plan), PLAN);
    let refused = std::sync::Arc::new(AtomicBool::new(false));
    let r = refused.clone();
    let (url, log) = ws_rate::server(Box::new(move |v: &Value| {
        if v["type"] == "context.add" && !r.swap(true, Ordering::SeqCst) {
            let error = ws_rate::from_server(
                "error",
                json!({"code": code, "message": "not now", "recoverable": true,
                    "related_to": v["id"]}),
            );
            (false, vec![error])
        } else {
            (true, vec![])
        }
    }))
    .await;
    let mut cfg = ws_rate::config(url);
    cfg.spool = Some(std::sync::Arc::new(spool));
    let mut ws = ws_rate::WsSink::new(cfg);
    ws.resend(plan);
    ws_rate::wait_until("the resend's leave", &log, || {
        ws_rate::taken(&log, "a").contains(&"leave".to_owned())
    })
    .await;
    let stats = ws.close(std::time::Duration::from_secs(10)).await;
    assert!(refused.load(Ordering::SeqCst));
    let delivered = ws_rate::taken(&log, "a").contains(&"Hello.".to_owned());
    let again = d.open();
    let offered_again = summary(&again).contains(&"s a context.add Hello.".to_owned());
    assert!(
        delivered != offered_again,
        "delivered: {delivered}, offered again: {offered_again}: {:?}",
        ws_rate::taken(&log, "a")
    );
    if offered_again {
        assert_eq!(summary(&again), PLAN);
        assert_eq!(stats.dropped, 1, "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_text_the_server_rate_limits_is_not_lost() {
    resent_text_refused_as("RATE_LIMITED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_text_refused_as_participant_not_found_is_not_lost() {
    resent_text_refused_as("PARTICIPANT_NOT_FOUND").await;
}

/// A journal from a session the server no longer has (a restart with another `--session`,
/// the old room gone): the resend is refused as SESSION_NOT_FOUND, given up on, and not
/// offered again by every later start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_to_a_session_the_server_lacks_is_given_up_once() {
    let d = Dir::new("resend-no-session");
    let mut t = Talk::new("old-room");
    write(&d.journal(), &one_undelivered(&mut t));
    let (spool, plan) = Spool::open(&d.0, Counter::default()).unwrap();
    let (url, log) = ws_rate::server(Box::new(move |v: &Value| {
        if v["session"] == "old-room" && v["type"] != "heartbeat.pong" {
            let error = ws_rate::from_server(
                "error",
                json!({"code": "SESSION_NOT_FOUND", "message": "no such session",
                    "recoverable": false, "related_to": v["id"]}),
            );
            (false, vec![error])
        } else {
            (true, vec![])
        }
    }))
    .await;
    let mut cfg = ws_rate::config(url);
    cfg.spool = Some(std::sync::Arc::new(spool));
    let mut ws = ws_rate::WsSink::new(cfg);
    ws.resend(plan);
    ws_rate::wait_until("the rejoin read", &log, || !log.lock().unwrap().is_empty()).await;
    let stats = ws.close(std::time::Duration::from_secs(10)).await;
    assert_eq!(stats.sent + stats.dropped, 3, "{stats:?}");
    assert_eq!(summary(&d.open()), Vec::<String>::new());
}
