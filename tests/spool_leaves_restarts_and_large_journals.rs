//! The `--spool DIR` delivery journal, through the public `Spool::open` (the thresholds a
//! running gateway has: compaction at 64 MiB) and the real binary: text refused after its
//! participant's leave, text a hung server never read at a stop, a start on a large journal.
//!
//! Found by review aj (session 44).

mod common;
#[path = "common/ws_recorder.rs"]
mod ws_recorder;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender, http_get, sample};
use futures_util::StreamExt;

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

/// The join kept for text refused after the leave goes once that text is delivered: a
/// compaction then keeps nothing of the participant (the journal does not grow with everyone
/// that ever left).
#[test]
fn the_join_kept_for_text_refused_after_the_leave_goes_once_it_is_delivered() {
    let d = Dir::new("late-delivered");
    let (spool, _) = d.open();
    let mut talk = Talk::new("s");
    deliver(&spool, &talk.join("alice", "Alice"));
    let text = talk.add("alice", "Refused after the leave, delivered later.");
    deliver(&spool, &text);
    deliver(&spool, &talk.leave("alice"));
    spool.again(&text);
    spool.done(text.id());
    compact_with_filler(&d, &spool, &mut talk);
    let journal = std::fs::read_to_string(d.journal()).unwrap();
    assert!(!journal.contains("Alice"), "{journal}");
    drop(spool);
    assert!(said_by(&d.open().1, "alice").is_empty());
}

/// Whether the envelope whose `add` record holds `content` is marked done in the journal.
fn done_in_journal(d: &Dir, content: &str) -> bool {
    let journal = std::fs::read_to_string(d.journal()).unwrap_or_default();
    let id = journal.lines().find_map(|l| {
        let v: Value = serde_json::from_str(l).ok()?;
        (v["add"]["payload"]["content"].as_str()? == content)
            .then(|| v["add"]["id"].as_str().map(str::to_owned))?
    });
    id.is_some_and(|id| journal.contains(&format!("{{\"done\":\"{id}\"}}")))
}

/// Whether the journal holds the `add` record of the envelope whose content is `content`.
fn added_in_journal(d: &Dir, content: &str) -> bool {
    std::fs::read_to_string(d.journal())
        .unwrap_or_default()
        .contains(&format!("\"content\":\"{content}\""))
}

/// Waits until the gateway serving /metrics at `metrics` has written `n` envelopes (each
/// write observes its latency) and the journal holds the `add` record of `content`.
async fn written_and_journaled(metrics: std::net::SocketAddr, n: f64, d: &Dir, content: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http_get(metrics, "/metrics");
        if sample(&body, "pvp_t140_send_latency_seconds_count").unwrap_or(0.0) >= n
            && added_in_journal(d, content)
        {
            return;
        }
        assert!(Instant::now() < deadline, "never written: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server that stopped reading (hung, its host gone behind a partition): the text goes into
/// the connection's socket buffers, and no pong comes back for the ping behind it. README:
/// text "not yet shown read when the connection is lost goes again after the rejoin"; a
/// gateway SIGKILLed before it notices the loss (silence, write timeout) must leave it
/// undelivered in its journal, for the next start to send. It was marked done as written, and
/// lost (review aj, session 44); the journal now marks text done when a pong shows it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_a_server_never_read_is_resent_after_a_kill() {
    let d = Dir::new("never-read");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    // Takes the connection and its first frame (the join), then reads nothing more.
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let _join = ws.next().await;
        std::future::pending::<()>().await;
        drop(ws);
    });
    let spool = d.0.to_str().unwrap().to_owned();
    let mut gw = Gateway::start_for_server(&url, &["--spool", &spool, "--metrics", "127.0.0.1:0"]);
    let metrics = gw.metrics_addr();
    let mut a = Sender::new(gw.listen, 0x5a);
    a.send("Written, never read. ");
    // The join and the text.
    written_and_journaled(metrics, 2.0, &d, "Written, never read.").await;
    gw.kill();
    server.abort();
    assert!(!done_in_journal(&d, "Written, never read."));
    let (_, plan) = d.open();
    assert!(
        said_by(&plan, &a.participant()).contains(&format!(
            "{} context.add Written, never read.",
            a.participant()
        )),
        "{:?}",
        said_by(&plan, &a.participant())
    );
}

/// The other side of it: text a server read (the pong to the ping behind it came back) is
/// marked done, and a start after a kill does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_a_server_read_is_not_resent_after_a_kill() {
    let d = Dir::new("read");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    // Reads every frame (tungstenite answers each ping as it reads).
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        while let Some(Ok(_)) = ws.next().await {}
    });
    let spool = d.0.to_str().unwrap().to_owned();
    let mut gw = Gateway::start_for_server(&url, &["--spool", &spool]);
    let mut a = Sender::new(gw.listen, 0x5b);
    a.send("Written and read. ");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done_in_journal(&d, "Written and read.") {
        assert!(Instant::now() < deadline, "never marked done");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.kill();
    server.abort();
    let (_, plan) = d.open();
    assert!(
        said_by(&plan, &a.participant()).is_empty(),
        "{:?}",
        said_by(&plan, &a.participant())
    );
}

/// The same stopped with SIGTERM: the connection writes the leave and a Close, and the server
/// sends no Close back (it read nothing: a server's Close answers ours only once it has read
/// all that came before). README: on a stop, "what was not written is logged and counted as
/// dropped (with --spool, the next start sends it)"; the text the server never read was marked
/// done as written, and the next start did not send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_a_server_never_read_is_resent_after_a_stop() {
    let d = Dir::new("never-read-stop");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let _join = ws.next().await;
        std::future::pending::<()>().await;
        drop(ws);
    });
    let spool = d.0.to_str().unwrap().to_owned();
    let mut gw = Gateway::start_for_server(&url, &["--spool", &spool, "--metrics", "127.0.0.1:0"]);
    let metrics = gw.metrics_addr();
    let mut a = Sender::new(gw.listen, 0x5c);
    a.send("Written, never read, then a stop. ");
    // The join and the text.
    written_and_journaled(metrics, 2.0, &d, "Written, never read, then a stop.").await;
    let status = tokio::task::block_in_place(|| gw.terminate(Duration::from_secs(20)));
    assert!(status.success(), "{status}");
    server.abort();
    let (_, plan) = d.open();
    let who = a.participant();
    let said = said_by(&plan, &who);
    let kinds: Vec<_> = said.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert_eq!(
        kinds,
        ["session.join", "context.add", "session.leave"],
        "{said:?}"
    );
    assert_eq!(
        said[1],
        format!("{who} context.add Written, never read, then a stop.")
    );
}

/// Past 256 MiB undelivered (a long outage under heavy traffic) the journal is no longer
/// compacted and grows by all the traffic until the next start (README), gigabytes a day. That
/// start held every envelope of the journal in memory (parsed) before dropping the delivered
/// ones: a journal of 200 MB, all of it delivered, took the gateway to 384 MiB at start, and
/// a day's journal could not be read at all (the gateway killed for memory at every start, the
/// journal never rewritten). What is delivered is let go as its mark is read.
#[test]
fn a_start_reading_a_large_delivered_journal_holds_little_of_it() {
    use std::io::Write as _;
    let d = Dir::new("large");
    let mut talk = Talk::new("s");
    let text = "x".repeat(1300);
    let mut out = std::io::BufWriter::new(std::fs::File::create(d.journal()).unwrap());
    let j = talk.join("bob", "Bob");
    writeln!(out, "{{\"add\":{},\"n\":0}}", j.json()).unwrap();
    writeln!(out, "{{\"done\":\"{}\"}}", j.id()).unwrap();
    for n in 1..150_000u64 {
        let e = talk.add("bob", &text);
        writeln!(out, "{{\"add\":{},\"n\":{n}}}", e.json()).unwrap();
        writeln!(out, "{{\"done\":\"{}\"}}", e.id()).unwrap();
    }
    let last = talk.add("bob", "Undelivered, at the end.");
    writeln!(out, "{{\"add\":{},\"n\":150000}}", last.json()).unwrap();
    out.flush().unwrap();
    drop(out);
    assert!(std::fs::metadata(d.journal()).unwrap().len() > 200 << 20);
    let spool = d.0.to_str().unwrap().to_owned();
    // No server needed: the start reads the journal before any connection.
    let mut gw = Gateway::start_for_server("ws://127.0.0.1:9/", &["--spool", &spool]);
    let line = gw.wait_stderr(Duration::from_secs(120), "spool open");
    let peak_mib = gw.peak_rss_kib() / 1024;
    gw.kill();
    assert!(line.contains("\"resend\":3"), "{line}");
    assert!(peak_mib < 120, "peak RSS {peak_mib} MiB at start");
}

/// After a restart, the resend of a participant's undelivered text (rejoin, text, leave) and
/// what the same participant says in the new run (same SSRC, same id) reach the server in that
/// order: the new run's join after the resend's leave (pvp-spec 19.5, per-sender order), the
/// old text before the new, and nothing twice; the journal then holds nothing for a next start.
/// (The test server refuses these bare payloads as INVALID_MESSAGE, which is counted, not
/// resent: the order is what is checked. A first version of the close fix journaled the text
/// again when the server ended the connection without a Close frame seen: not lost, so not
/// unread.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarts_resend_goes_before_the_same_participants_new_traffic() {
    use common::pvp_server::TestPvpServer;
    use pvp_t140::metrics::SinkMetrics;
    use pvp_t140::sink::ws::{WsConfig, WsSink};
    use std::sync::Arc;
    let d = Dir::new("resend-order");
    let p = "t140:0000beef@127.0.0.1:40010";
    let mut talk = Talk::new("s");
    // The last run: joined (written), then said two sentences it did not write; killed.
    {
        let (spool, _) = d.open();
        deliver(&spool, &talk.join(p, "Old"));
        spool.added(&talk.add(p, "Old one."));
        spool.added(&talk.add(p, "Old two."));
    }
    let server = TestPvpServer::start().await;
    let (spool, resend) = d.open();
    let spool = Arc::new(spool);
    let mut ws = WsSink::new(WsConfig {
        url: server.url(),
        session: "s".into(),
        heartbeat: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        silence: Duration::from_secs(90),
        queue: 4096,
        metrics: SinkMetrics::default(),
        tls: None,
        spool: Some(spool.clone()),
        gate: None,
    });
    ws.resend(resend);
    // The new run's traffic of the same participant, at once.
    ws.send(talk.join(p, "New"));
    ws.send(talk.add(p, "New one."));
    ws.send(talk.leave(p));
    server
        .wait_until(Duration::from_secs(20), "everything", |s| {
            s.received_of_type("session.leave").len() == 2
        })
        .await;
    let stats = ws.close(Duration::from_secs(5)).await;
    let seen: Vec<String> = server
        .received()
        .iter()
        .map(|r| {
            let v = &r.envelope;
            let about = v["payload"]["content"]
                .as_str()
                .or(v["payload"]["participant"]["name"].as_str())
                .unwrap_or("");
            format!("{} {about}", v["type"].as_str().unwrap())
                .trim_end()
                .to_owned()
        })
        .filter(|l| !l.starts_with("heartbeat"))
        .collect();
    assert_eq!(
        seen,
        [
            "session.join Old",
            "context.add Old one.",
            "context.add Old two.",
            "session.leave",
            "session.join New",
            "context.add New one.",
            "session.leave",
        ],
        "{stats:?}"
    );
    let spool = Arc::try_unwrap(spool).expect("the sink let go of the spool");
    drop(spool);
    let next = d.open().1;
    assert!(next.is_empty(), "{:?} {stats:?}", said_by(&next, p));
}

/// With `--gate-transcripts`, a participant that has left (its leave held behind a chunk
/// awaiting approval, its queue closed) has the chunk approved during a RATE_LIMITED pause,
/// and the gateway stops: the stop path waits the pause out and writes the chunk and the leave
/// into a server that reads nothing more (no pong, no Close back). The stop path marked the
/// chunk done as it wrote it and did not ask about it, so the next start did not send it and
/// the `stopped` line counted it sent; now it is held and asked about as text written before
/// the stop is: counted as dropped and undelivered in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_the_stop_path_writes_into_a_hung_server_is_resent_by_the_next_start() {
    use pvp_t140::sink::ws::{WsConfig, WsSink};
    use tokio_tungstenite::tungstenite::Message;
    let d = Dir::new("stop-path-hung");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    // Reads up to the chunk's gate.request, refuses it as RATE_LIMITED (a pause), an approver
    // approves the chunk, and the server reads nothing more.
    let server = tokio::spawn(async move {
        use futures_util::SinkExt;
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        while let Some(Ok(m)) = ws.next().await {
            let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                continue;
            };
            if v["type"] == "gate.request" {
                let refusal = json!({"v": 1, "id": "01JQ0000000000000000000001",
                    "ts": "2026-11-25T00:00:00.000Z", "session": "s", "sender": "server",
                    "type": "error", "payload": {"code": "RATE_LIMITED", "message": "slow down",
                    "recoverable": true, "related_to": v["id"]}});
                let approve = json!({"v": 1, "id": "01JQ0000000000000000000002",
                    "ts": "2026-11-25T00:00:00.000Z", "session": "s", "sender": "approver-1",
                    "type": "gate.approve", "ref": v["id"],
                    "payload": {"gate": v["id"], "approver": "approver-1"}});
                for r in [refusal, approve] {
                    ws.send(Message::text(r.to_string())).await.unwrap();
                }
                break;
            }
        }
        std::future::pending::<()>().await;
        drop(ws);
    });
    let (spool, _) = d.open();
    let metrics = pvp_t140::metrics::SinkMetrics::default();
    let cfg = WsConfig {
        metrics: metrics.clone(),
        spool: Some(std::sync::Arc::new(spool)),
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(30),
        }),
        ..ws_recorder::config(url)
    };
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new("s");
    let who = "t140:0000e001@127.0.0.1:40301";
    ws.send(talk.join(who, "Eve"));
    ws.send(talk.add(who, "Approved in a pause, then a stop."));
    ws.send(talk.leave(who));
    // The approval read, within the pause.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics.gates_approved.get() == 0 {
        assert!(Instant::now() < deadline, "never approved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = ws.close(Duration::from_secs(10)).await;
    server.abort();
    // Sent: the join and the leave.
    assert_eq!((stats.sent, stats.dropped), (2, 1), "{stats:?}");
    let (_, plan) = d.open();
    assert_eq!(
        said_by(&plan, who),
        [
            format!("{who} session.join Eve"),
            format!("{who} context.add Approved in a pause, then a stop."),
            format!("{who} session.leave"),
        ]
    );
}
