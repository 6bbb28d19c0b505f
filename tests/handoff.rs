//! The hand-off from the receive workers to the sink under backpressure (`handoff`), driven by
//! the sans-IO core, and the stdout writer at its end: what a full queue or a stuck stdout
//! refuses, and what is counted. Each test failed before the fix it pins.

use std::collections::HashSet;

use pvp_t140::Time;
use pvp_t140::handoff;
use pvp_t140::pvp::{Builder, Envelope, Kind, Message, SenderId};
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// The shell's backpressure (`udp::run_worker` hands each batch to `handoff::Sender::offer`,
/// which refuses the newest envelopes that do not fit): stream 7 fills a queue of 4 (its join
/// and three items), stream 8 says "Hello. " while it is full, the sink catches up, stream 8
/// sends `then` at 300 ms and the gateway stops. Everything the sink was handed, and what the
/// hand-offs of "Hello. " and of `then` refused.
fn behind_a_full_queue(then: &str) -> (Vec<Message>, [usize; 2]) {
    let (mut tx, mut rx) = handoff::queue(4);
    let mut gw = Gateway::new(Config::default());
    let mut hand_off = |gw: &mut Gateway| {
        let batch: Vec<_> = std::iter::from_fn(|| gw.poll_output()).collect();
        tx.offer(batch)
    };
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "One. Two. Three. "));
    assert_eq!(hand_off(&mut gw), 0);
    gw.handle_datagram(at(10), addr(4002), &t140(1, 8, "Hello. "));
    let hello = hand_off(&mut gw);
    let mut written: Vec<Message> = Vec::new();
    while let Some(b) = rx.try_recv(1000) {
        written.extend(b.iter().map(|e| e.to_message()));
    }
    gw.handle_datagram(at(300), addr(4002), &t140(2, 8, then));
    let later = hand_off(&mut gw);
    gw.shutdown(at(400));
    let _ = tx.force(std::iter::from_fn(|| gw.poll_output()).collect());
    drop(tx);
    while let Some(b) = rx.try_recv(1000) {
        written.extend(b.iter().map(|e| e.to_message()));
    }
    (written, [hello, later])
}

/// pvp-spec 6.3 / 9.1 / 19.4: the core marks a speaker joined as soon as it makes the join, so
/// a join that finds no room waits in the worker and goes first once there is room, and
/// leaves pass a full queue. (The join was refused like any envelope, and every later
/// `context.add`, `context.update` and the `session.leave` of that participant went out once
/// the queue had room, from a participant that never joined: the server answers each with
/// PARTICIPANT_NOT_FOUND or UNAUTHORIZED, so one dropped envelope lost the speaker's whole
/// transcript, not one chunk.)
#[test]
fn an_overflowing_sink_queue_never_delivers_items_of_a_participant_whose_join_it_dropped() {
    let (written, refused) = behind_a_full_queue("Still here. ");
    assert_eq!(refused, [1, 0], "Hello's context.add; its join waits");
    let mut joined = HashSet::new();
    for m in &written {
        if m.kind == "session.join" {
            joined.insert(m.sender.clone());
        } else {
            assert!(
                joined.contains(&m.sender),
                "{} from {} written without its session.join",
                m.kind,
                m.sender
            );
        }
    }
}

/// pvp-spec 9.3 (`context.update` / `context.remove` name an existing item): the
/// `context.add` of "Hello." a full queue refused never reaches the sink, and the speaker's
/// backspaces correct it later as its last item: that `context.update` is refused too, as the
/// gates drop "corrections of a dropped chunk ... with it" (README). It went through once the
/// queue had room, for a key the consumer never saw (review, session 32).
#[test]
fn a_correction_of_an_item_the_full_queue_refused_is_not_delivered() {
    // Stream 8 erases the space and two letters of what it said.
    let (written, refused) = behind_a_full_queue("\u{8}\u{8}\u{8}");
    assert_eq!(
        refused,
        [1, 1],
        "the context.add, then the correction with it"
    );
    let mut added = HashSet::new();
    for m in &written {
        let key = m.payload["key"].as_str().map(str::to_owned);
        match m.kind.as_str() {
            "context.add" => {
                added.insert(key.unwrap());
            }
            "context.update" | "context.remove" => {
                let key = key.unwrap();
                assert!(
                    added.contains(&key),
                    "{} of {key} delivered, but its context.add was refused: {written:#?}",
                    m.kind
                );
            }
            _ => {}
        }
    }
}

/// README ("one bounded queue between the receive workers and the sink (65,536); when either
/// is full, new envelopes are refused"): behind a stuck sink (a stdout nobody reads, README "a
/// stuck pipeline"), streams that come and go (each says a sentence and sends BYE;
/// `--max-streams` caps the live ones at 4 here) must not grow the queue past its bound by
/// more than a leave a live stream. Joins and leaves used to pass the bound, two a
/// participation: 500 such streams left 1,005 envelopes queued behind a bound of 16.
#[test]
fn membership_envelopes_behind_a_stuck_sink_stay_bounded_by_the_live_streams() {
    let bound = 16;
    let max_streams = 4;
    let (mut tx, rx) = handoff::queue(bound);
    let mut gw = Gateway::new(Config {
        max_streams,
        max_pps_per_source: 0,
        reorder_wait: std::time::Duration::ZERO,
        ..Config::default()
    });
    let mut t = 0;
    for i in 0..500u32 {
        let ssrc = 100 + i;
        gw.handle_datagram(at(t), addr(4000), &t140(1, ssrc, "Hi. "));
        let mut bye = Vec::new();
        pvp_t140::rtcp::write_bye(&mut bye, ssrc);
        gw.handle_datagram(at(t + 10), addr(4000), &bye);
        t += 20;
        gw.handle_timeout(at(t));
        // The worker hands its output on; the sink never takes any (stdout is stuck).
        let batch: Vec<_> = std::iter::from_fn(|| gw.poll_output()).collect();
        tx.offer(batch);
        assert!(gw.stats().streams_live <= max_streams as u64);
    }
    // The bound, plus a leave for each stream that can be alive (a join without room waits
    // in the worker, and goes with its leave if that comes first).
    let most = bound + max_streams;
    assert!(
        rx.depth() <= most,
        "{} envelopes queued behind a stuck sink (bound {bound}, at most {max_streams} streams \
         alive at once)",
        rx.depth()
    );
}

/// A writer standing for a stdout nobody reads: says when the first write starts, then blocks
/// until the test ends (and fails then, as a pipe whose reader left).
struct Stuck {
    entered: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

impl std::io::Write for Stuck {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        let _ = self.entered.send(());
        let _ = self.release.recv();
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// README ("a stdout that nobody reads ... after the 5 s what was not written is logged and
/// counted as dropped (`stopped ... dropped=N`)") and its mapping rules (speakers given one
/// participant id "are one participant: it joins with the first of them and leaves with the
/// last"). The stdout writer holds back the joins and leaves of a participant's other speakers
/// (`Presence`), and with stdout working they count as neither sent nor dropped; with stdout
/// stuck at the end, `StdoutSink::close` counts as dropped only what was to be written. It
/// counted the second speaker's join and leave too (`dropped=3`).
#[tokio::test]
async fn a_stuck_stdout_does_not_count_held_back_joins_and_leaves_as_dropped() {
    use pvp_t140::metrics::SinkMetrics;
    use pvp_t140::pvp::{Builder, Kind, SenderId};
    use pvp_t140::sink::stdout::StdoutSink;
    use serde_json::json;

    let mut b = Builder::new("s".into(), None, 1);
    let mut env = |kind| b.envelope(at(0), SenderId::from("room"), kind, &json!({}));
    let (mut tx, rx) = handoff::queue(1000);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let sink = StdoutSink::with_writer(
        rx,
        SinkMetrics::default(),
        std::time::Duration::from_millis(200),
        Box::new(Stuck {
            entered: entered_tx,
            release: release_rx,
        }),
    )
    .unwrap();
    // The first speaker joins "room": the writer takes it and sticks in its write.
    assert_eq!(tx.offer(vec![env(Kind::SessionJoin)]), 0);
    entered
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the writer writes");
    // A second speaker of the same participant joins and leaves: both are held back
    // (one join and one leave a participant id), never to be written.
    assert_eq!(
        tx.offer(vec![env(Kind::SessionJoin), env(Kind::SessionLeave)]),
        0
    );
    drop(tx);
    let stats = sink.close().await;
    drop(release);
    assert_eq!(
        stats.dropped, 1,
        "only the first join was to be written and was not: {stats:?}"
    );
}

fn taken(rx: &mut handoff::Receiver) -> Vec<Message> {
    let mut got = Vec::new();
    while let Some(b) = rx.try_recv(usize::MAX) {
        got.extend(b.iter().map(Envelope::to_message));
    }
    got
}

fn summary(got: &[Message]) -> Vec<String> {
    got.iter()
        .map(|m| format!("{} {} {}", m.kind, m.session, m.sender))
        .collect()
}

/// README: "one id may speak in two sessions (a `[[stream]]` rule's participant in two
/// rooms)", and `Presence` keys a participant by (session, id). With the queue full, "room"
/// joins session s2 (its join waits in the worker); then "room" of session s1, whose join went
/// in long ago, leaves: the leave goes in, and s2's join goes before its text. The held joins
/// were keyed by the id alone: the s1 leave was taken for the waiting one's, refused with it,
/// and s2 got its text with no join (pvp-spec 6.3) (review, session 32).
#[test]
fn a_leave_in_one_session_does_not_cancel_a_join_waiting_in_another() {
    let (mut tx, mut rx) = handoff::queue(1);
    let mut s1 = Builder::new("s1".into(), None, 1);
    let mut s2 = Builder::new("s2".into(), None, 2);
    let room = || SenderId::from("room");
    let join1 = s1.envelope(Time(0), room(), Kind::SessionJoin, &serde_json::json!({}));
    assert_eq!(tx.offer(vec![join1]), 0);
    // The queue is full (its bound, 1): s2's join waits.
    let join2 = s2.envelope(Time(1), room(), Kind::SessionJoin, &serde_json::json!({}));
    assert_eq!(tx.offer(vec![join2]), 0, "a join is never refused");
    // s1's "room" leaves: a leave passes a full queue.
    let leave1 = s1.envelope(Time(2), room(), Kind::SessionLeave, &serde_json::json!({}));
    let refused = tx.offer(vec![leave1]);
    let mut got = taken(&mut rx);
    // The sink caught up: the next hand-off takes the waiting join in (the queue's one place).
    assert_eq!(tx.offer(Vec::new()), 0);
    got.extend(taken(&mut rx));
    // s2's "room" says something.
    let add2 = s2.envelope(
        Time(3),
        room(),
        Kind::ContextAdd,
        &serde_json::json!({"key": "k"}),
    );
    assert_eq!(tx.offer(vec![add2]), 0);
    got.extend(taken(&mut rx));
    assert_eq!(
        (refused, summary(&got)),
        (
            0,
            vec![
                "session.join s1 room".to_owned(),
                "session.leave s1 room".to_owned(),
                "session.join s2 room".to_owned(),
                "context.add s2 room".to_owned(),
            ]
        ),
        "s1's leave went in, s2's join before its text"
    );
}
