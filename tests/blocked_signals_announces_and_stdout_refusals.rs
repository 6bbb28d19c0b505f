//! The stdio binding, the hand-off from the receive workers to the sink, and the stop: a
//! gateway started with the stop signals blocked still stops on SIGTERM; a speaker's announce
//! folds only into its own waiting join; refusals behind an unread stdout are logged while
//! running; the stop over a full disk says so.
//!
//! Found by review ba (session 47).

mod common;

use std::time::Duration;

use common::gateway_proc::Gateway;
use pvp_t140::Time;
use pvp_t140::handoff;
use pvp_t140::presence::Presence;
use pvp_t140::pvp::{Builder, Envelope, Kind, Message, SenderId};

/// What a sink writes of `batches`: each envelope its [`Presence`] lets out, as a sink does.
fn written(presence: &mut Presence, rx: &mut handoff::Receiver) -> Vec<Message> {
    let mut got = Vec::new();
    while let Some(b) = rx.try_recv(usize::MAX) {
        got.extend(
            b.iter()
                .filter(|e| presence.admit(e))
                .map(Envelope::to_message),
        );
    }
    got
}

/// A speaker's participant as the core describes it: its metadata names the speaker (its
/// SSRC), its id the participant a mapping rule gives it ("room", shared).
fn participant(ssrc: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "id": "room",
        "name": name,
        "metadata": {"ssrc": ssrc},
    })
}

/// Found by review ba (session 47). Two speakers a mapping rule gives one participant id
/// ("room"), on one worker: speaker 1's join went in; the queue is full when speaker 2 joins,
/// so speaker 2's join waits in the worker; then speaker 1's RTCP name comes
/// (`participant.announce`, pvp-spec 7.1). The announce was taken for the waiting join's and
/// folded into it, whichever speaker the join was of: speaker 2's join went in later renamed
/// after speaker 1, held back by the sink's `Presence` (the participant is in already), and
/// speaker 1's announce was neither written nor counted as refused: the name was lost with no
/// trace. An announce folds only into its own speaker's waiting join; another's is refused
/// for want of room, and counted.
#[test]
fn an_announce_is_not_folded_into_another_speakers_waiting_join() {
    let (mut tx, mut rx) = handoff::queue(1);
    let mut presence = Presence::default();
    let mut b = Builder::new("s".into(), None, 1);
    let room = || SenderId::from("room");
    let join = |b: &mut Builder, t, ssrc| {
        b.envelope(
            Time(t),
            room(),
            Kind::SessionJoin,
            &serde_json::json!({ "participant": participant(ssrc, &format!("T.140 {ssrc}")) }),
        )
    };
    let join1 = join(&mut b, 0, "00000001");
    assert_eq!(tx.offer(vec![join1]), 0);
    // The queue is full (its bound, 1): speaker 2's join waits.
    let join2 = join(&mut b, 1, "00000002");
    assert_eq!(tx.offer(vec![join2]), 0, "a join is never refused");
    // Speaker 1 is named by its RTCP.
    let announce1 = b.envelope(
        Time(2),
        room(),
        Kind::ParticipantAnnounce,
        &participant("00000001", "Ada"),
    );
    let refused = tx.offer(vec![announce1]);
    let mut got = written(&mut presence, &mut rx);
    // The sink caught up: the waiting join goes in.
    assert_eq!(tx.offer(Vec::new()), 0);
    got.extend(written(&mut presence, &mut rx));
    let named_ada = got
        .iter()
        .any(|m| m.payload["name"] == "Ada" || m.payload["participant"]["name"] == "Ada");
    assert!(
        named_ada || refused == 1,
        "speaker 1's name is written or its announce counted as refused: refused {refused}, \
         written {:?}",
        got.iter()
            .map(|m| format!("{} {}", m.kind, m.payload))
            .collect::<Vec<_>>()
    );
}

/// Found by review ba (session 47). As above, with both speakers' joins waiting (the queue was
/// full when each joined) when speaker 1's RTCP name comes: it was folded into the newest
/// waiting join of the id, speaker 2's, so speaker 1's join went in under its first name
/// (the one `Presence` lets out) and speaker 2's, renamed "Ada", was held back: the participant
/// never got its name. It goes into speaker 1's own join.
#[test]
fn an_announce_renames_its_own_speakers_waiting_join_not_the_newest() {
    let (mut tx, mut rx) = handoff::queue(1);
    let mut presence = Presence::default();
    let mut b = Builder::new("s".into(), None, 1);
    let room = || SenderId::from("room");
    let filler = b.envelope(
        Time(0),
        SenderId::from("other"),
        Kind::SessionJoin,
        &serde_json::json!({ "participant": {"id": "other"} }),
    );
    assert_eq!(tx.offer(vec![filler]), 0);
    let join = |b: &mut Builder, t, ssrc| {
        b.envelope(
            Time(t),
            room(),
            Kind::SessionJoin,
            &serde_json::json!({ "participant": participant(ssrc, &format!("T.140 {ssrc}")) }),
        )
    };
    let joins = vec![join(&mut b, 1, "00000001"), join(&mut b, 2, "00000002")];
    assert_eq!(tx.offer(joins), 0, "both wait");
    let announce1 = b.envelope(
        Time(3),
        room(),
        Kind::ParticipantAnnounce,
        &participant("00000001", "Ada"),
    );
    assert_eq!(tx.offer(vec![announce1]), 0, "folded into a waiting join");
    let mut got = written(&mut presence, &mut rx);
    // The sink catches up, one place at a time.
    for _ in 0..2 {
        assert_eq!(tx.offer(Vec::new()), 0);
        got.extend(written(&mut presence, &mut rx));
    }
    let joined: Vec<_> = got
        .iter()
        .filter(|m| m.kind == "session.join" && m.sender == "room")
        .map(|m| m.payload["participant"]["name"].clone())
        .collect();
    assert_eq!(joined, ["Ada"], "the participant joins named by its RTCP");
}

/// Found by review ba (session 47). README, "Scaling out": "The sink, the RTCP reader and the
/// metrics endpoint run on one more thread". With stdout the sink, the writer is a thread of
/// its own (`stdout-sink`, `src/sink/stdout.rs`: a stdout nobody reads blocks it, not the
/// runtime), which `top -H` shows beside the `pvp-rx-N` the section names; only a WebSocket
/// sink is a task on that one more thread.
#[test]
fn the_readme_names_the_stdout_writers_own_thread() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0"]);
    let names = gw.thread_names();
    assert!(gw.terminate(Duration::from_secs(20)).success());
    assert!(
        names.iter().any(|n| n == "stdout-sink"),
        "the stdout writer's thread: {names:?}"
    );
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let from = readme.find("### Scaling out").unwrap();
    let section = &readme[from..from + readme[from..].find("\n## ").unwrap()];
    let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        !flat.contains("The sink, the RTCP reader and the metrics endpoint run on one more thread"),
        "the stdout writer is not on that thread"
    );
    assert!(
        flat.contains("`stdout-sink`"),
        "the section names the writer's thread"
    );
}

/// Found by review ba (session 47). A process inherits its signal mask across exec (POSIX
/// XSH `exec`): a gateway started by a parent that had SIGTERM, SIGINT and SIGHUP blocked (a
/// launcher's thread that blocks them to take signals elsewhere) caught them with a handler
/// that was never run, since a blocked signal is only made pending. SIGTERM did nothing, and
/// the supervisor's SIGKILL after its stop timeout lost what every stream held, with no
/// `session.leave` (README: SIGTERM "flushes every stream, prints a `session.leave` for
/// each"). The gateway unblocks the signals it catches.
#[test]
fn sigterm_stops_a_gateway_started_with_the_stop_signals_blocked() {
    // `env --block-signal` (GNU coreutils) starts the gateway with them blocked; the
    // shell's `exec env` takes the place of `start_after`'s own exec.
    let mut gw = Gateway::start_after(
        "exec env --block-signal=TERM,INT,HUP \"$0\" \"$@\"",
        &["--listen", "127.0.0.1:0", "--idle-flush-ms", "60000"],
    );
    // The threads started before the gateway unblocked them (its log writer's) keep the mask
    // they were started with: the start had SIGTERM blocked.
    let sigterm_blocked = |task: std::fs::DirEntry| {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (15 - 1)) != 0)
    };
    let tasks = std::fs::read_dir(format!("/proc/{}/task", gw.pid())).unwrap();
    assert!(
        tasks.flatten().any(sigterm_blocked),
        "started with SIGTERM blocked"
    );
    let mut s = common::gateway_proc::Sender::new(gw.listen, 0x5150);
    // No sentence end and a minute's idle flush: held until the stop, which reads what the
    // kernel already took for the socket first.
    s.send("held until the stop");
    assert!(gw.terminate(Duration::from_secs(20)).success());
    let out = gw.stdout_lines().join("\n");
    assert!(out.contains("\"content\":\"held until the stop\""), "{out}");
    assert!(out.contains("\"type\":\"session.leave\""), "{out}");
}

/// Found by review ba (session 47). Stdout redirected to a full disk (`/dev/full`: ENOSPC on
/// every write), which the writer waits out as README says ("a full disk under a redirected
/// stdout ... is no failure: the writer waits for room"). At the stop, what it could not
/// write in the grace is counted as dropped, and the warning asked "is stdout read?": the
/// wrong question for a file on a full disk, where /healthz says "or the disk is full". The
/// warning names both causes, and the count is there.
#[test]
fn the_stop_over_a_full_disk_under_stdout_does_not_blame_the_reader_alone() {
    let mut gw = Gateway::start_after(
        "exec >/dev/full",
        &["--listen", "127.0.0.1:0", "--idle-flush-ms", "60000"],
    );
    let mut s = common::gateway_proc::Sender::new(gw.listen, 0x5151);
    s.send("Onto a full disk. ");
    gw.wait_stderr(Duration::from_secs(20), "waiting for room");
    assert!(gw.terminate(Duration::from_secs(30)).success());
    let warned = gw.wait_stderr(Duration::from_secs(5), "did not finish within");
    let message = common::gateway_proc::log_field(&warned, "message");
    assert!(message.contains("disk"), "{message}");
    let stopped = gw.wait_stderr(Duration::from_secs(5), "\"stopped\"");
    // The join, the sentence and the leave: none written, each counted.
    let count = |name| common::gateway_proc::log_number(&stopped, name);
    assert_eq!((count("sent"), count("dropped")), (0, 3), "{stopped}");
}

/// Found by review ba (session 47). Behind a stdout nobody reads, the queue to the sink fills
/// and every envelope after is refused: counted (`pvp_t140_sink_queue_refused_total`), but the
/// log said nothing until the stop (each worker's `sink queue was full` then), while a
/// gateway could refuse every word for hours; a WebSocket participant's full queue is logged
/// at its first refusal and then at most every 10 s. The hand-off's refusals now are too.
#[test]
fn refusals_behind_an_unread_stdout_are_logged_while_running() {
    let mut gw = Gateway::start_unread(&["--listen", "127.0.0.1:0", "--max-pps-per-source", "0"]);
    let mut senders: Vec<_> = (0..8)
        .map(|i| common::gateway_proc::Sender::new(gw.listen, 0x7000 + i))
        .collect();
    let said = |gw: &Gateway| {
        gw.stderr_lines()
            .into_iter()
            .find(|l| l.contains("sink queue full"))
    };
    // A sentence a datagram, each a `context.add`: more than the queue's 65,536 envelopes,
    // sent until the refusal is said (the kernel may drop some of a burst).
    let mut sent = 0;
    while said(&gw).is_none() && sent < 400_000 {
        for _ in 0..1000 {
            for s in &mut senders {
                s.send("Word. ");
            }
        }
        sent += 8000;
        std::thread::sleep(Duration::from_millis(20));
    }
    let line = said(&gw).unwrap_or_else(|| {
        panic!(
            "no refusal said while running, {sent} sentences sent:\n{}",
            gw.stderr_lines().join("\n")
        )
    });
    assert!(
        common::gateway_proc::log_number(&line, "refused") > 0,
        "{line}"
    );
    // Said at the first and then at most every 10 s, not a line a refusal.
    let lines = gw
        .stderr_lines()
        .iter()
        .filter(|l| l.contains("sink queue full"))
        .count();
    assert_eq!(lines, 1);
    // At the stop every envelope made is counted once: written (`sent`), taken by the sink and
    // not written (`dropped`), or refused in front of it (`sink_queue_full`, apart).
    assert!(gw.terminate(Duration::from_secs(30)).success());
    let stopped = gw.wait_stderr(Duration::from_secs(5), "\"stopped\"");
    let counters = gw.wait_stderr(Duration::from_secs(5), "\"counters\"");
    let n = |line: &str, name| common::gateway_proc::log_number(line, name);
    assert!(n(&stopped, "sink_queue_full") > 0, "{stopped}");
    assert_eq!(
        n(&stopped, "sent") + n(&stopped, "dropped") + n(&stopped, "sink_queue_full"),
        n(&counters, "envelopes"),
        "{stopped}\n{counters}"
    );
}
