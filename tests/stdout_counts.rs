//! The stdout sink (found by review v) and PVP's stdio binding (pvp-spec 19.4), against the real binary.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway_proc::{Sender, log_number};
use common::sh_proc::Proc;

const WAIT: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    common::sh_proc::scratch("stdout-counts", name)
}

/// README ("Metrics and health", `_stdout_failed`): "the lines not known to have reached it
/// and every later one are counted as dropped"; a line counts as sent once stdout accepted its
/// last byte. stdout is a file at its size limit (`ulimit -f`): the write that crosses the
/// limit is short, and the rest of the line was taken into std's own line buffer in front of
/// the descriptor (`io::stdout()` is a `LineWriter`), reported as accepted, counted as sent,
/// and never written. `sent` must be the number of whole lines in the file.
#[test]
fn lines_sent_are_the_whole_lines_in_a_file_at_its_size_limit() {
    let dir = scratch("fsize-sent");
    let out = dir.join("out.ndjson");
    // 2 KiB (dash's `ulimit -f` counts 512-byte blocks).
    let mut gw = Proc::to_file(
        "ulimit -f 4",
        &out,
        &["--listen", "127.0.0.1:0", "--rtcp", "false"],
    );
    let mut a = Sender::new(gw.listen, 0x5eed_0a01);
    let deadline = Instant::now() + WAIT;
    let mut i = 0;
    while !gw.has("writing to stdout failed") {
        assert!(Instant::now() < deadline, "the file never filled");
        a.send(&format!("Sentence {i} fills the file a little more. "));
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = gw.terminate();
    assert!(status.code().is_some(), "{status:?}");
    let bytes = std::fs::read(&out).unwrap();
    let whole = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    let stopped = gw.stopped();
    let counters = gw.wait_stderr("\"message\":\"counters\"");
    let (sent, dropped) = (
        log_number(&stopped, "sent"),
        log_number(&stopped, "dropped"),
    );
    assert_eq!(
        sent + dropped,
        log_number(&counters, "envelopes"),
        "{stopped}"
    );
    assert_eq!(
        sent,
        whole,
        "{whole} whole lines in the file ({} bytes); {stopped}",
        bytes.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// stdout that blocks in its first write until released (a reader that comes back late), then
/// takes everything; it records the writes made after the release.
struct LateReader {
    entered: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
    first: bool,
    after_release: Arc<Mutex<Vec<usize>>>,
}

impl std::io::Write for LateReader {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.first {
            self.first = false;
            let _ = self.entered.send(());
            let _ = self.release.recv();
        }
        self.after_release.lock().unwrap().push(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// At the stop, what the stdout writer took but had not written when the grace ran out counts
/// as dropped (README, "Trying it" and "Metrics and health"), and the process exits. The writer
/// thread is not joined, so when stdout's reader comes back between that count and the exit, the
/// writer went on writing the rest of its batch: lines the `stopped` line counts as dropped
/// reached the reader (at most once is kept, the count is not). After the count, nothing more
/// may be written: the write in progress at that moment at most.
#[tokio::test]
async fn after_the_grace_lines_counted_dropped_are_not_written_when_stdout_comes_back() {
    use pvp_t140::pvp::{Builder, Kind, SenderId};
    let (mut tx, rx) = pvp_t140::handoff::queue(100_000);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let after_release = Arc::new(Mutex::new(Vec::new()));
    let (gone_tx, gone) = std::sync::mpsc::channel::<()>();
    struct Gone(#[allow(dead_code)] std::sync::mpsc::Sender<()>, LateReader);
    impl std::io::Write for Gone {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.1.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.1.flush()
        }
    }
    let sink = pvp_t140::sink::stdout::StdoutSink::with_writer(
        rx,
        pvp_t140::metrics::SinkMetrics::default(),
        Duration::from_millis(200),
        Box::new(Gone(
            gone_tx,
            LateReader {
                entered: entered_tx,
                release: release_rx,
                first: true,
                after_release: after_release.clone(),
            },
        )),
    )
    .unwrap();
    // 2,000 lines of about 250 bytes, in one hand-off: several of the writer's 64 KiB buffers.
    let mut b = Builder::new("s".into(), None, 1);
    let filler = "x".repeat(150);
    let batch: Vec<_> = (0..2000)
        .map(|i| {
            b.envelope(
                pvp_t140::Time::from_millis(1_700_000_000_000 + i),
                SenderId::from("p"),
                Kind::ContextAdd,
                &serde_json::json!({ "i": i, "pad": filler }),
            )
        })
        .collect();
    assert_eq!(tx.offer(batch), 0);
    drop(tx);
    entered.recv_timeout(WAIT).expect("the writer writes");
    let stats = sink.close().await;
    assert_eq!(stats.sent, 0);
    assert_eq!(stats.dropped, 2000);
    // The reader comes back.
    drop(release);
    let _ = gone.recv_timeout(WAIT);
    let writes = after_release.lock().unwrap().clone();
    assert!(
        writes.len() <= 1,
        "{} writes after the stop counted every line dropped: {writes:?}",
        writes.len()
    );
}

/// stdout whose reader has gone (`pvp-t140 | consumer`, the consumer crashed): every envelope
/// from then on is dropped, counted, and logged once. At the stop the status said success (0),
/// as if the run had delivered what it received: a script or supervisor checking it could not
/// tell a run whose output was lost. A failed stdout (EPIPE, EFBIG, EIO) makes the exit status 1
/// with an error saying so, as a failed receive worker does.
#[test]
fn a_stop_after_stdout_failed_exits_1_and_says_why() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut gw = Proc::start(
        "true",
        writer.into(),
        &["--listen", "127.0.0.1:0", "--rtcp", "false"],
    );
    let mut a = Sender::new(gw.listen, 0x5eed_0a02);
    a.send("Hello to nobody. ");
    gw.wait_stderr("writing to stdout failed");
    let status = gw.terminate();
    let stopped = gw.stopped();
    assert!(log_number(&stopped, "dropped") >= 2, "{stopped}");
    let lines = gw.stderr();
    assert_eq!(status.code(), Some(1), "{}", lines.join("\n"));
    let last = lines.last().unwrap();
    assert!(
        last.contains("\"level\":\"ERROR\"") && last.contains("stdout"),
        "{last}"
    );
}

/// A stdout pipe nobody reads until the gateway has exited (README: after SIGTERM the grace
/// passes, what was not written counts as dropped): the `stopped` line's `sent` is the number of
/// whole lines the reader then finds, and every envelope is counted once.
#[test]
fn an_unread_pipe_read_after_the_exit_holds_as_many_lines_as_were_counted_sent() {
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut gw = Proc::start(
        "true",
        writer.into(),
        &["--listen", "127.0.0.1:0", "--rtcp", "false"],
    );
    let mut a = Sender::new(gw.listen, 0x5eed_0a03);
    for i in 0..40 {
        let text: String = (0..10)
            .map(|j| {
                format!(
                    "Sentence {} is long enough to fill the pipe soon enough. ",
                    i * 10 + j
                )
            })
            .collect();
        a.send(&text);
    }
    let mut b = Sender::new(gw.listen, 0x5eed_0a04);
    b.send("The last one. ");
    gw.wait_stderr(&b.participant());
    let status = gw.terminate();
    assert!(status.success(), "{status:?}");
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut bytes).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let whole: Vec<&str> = text
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .collect();
    for l in &whole {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
    let stopped = gw.stopped();
    let counters = gw.wait_stderr("\"message\":\"counters\"");
    let (sent, dropped) = (
        log_number(&stopped, "sent"),
        log_number(&stopped, "dropped"),
    );
    assert!(dropped > 0, "{stopped}");
    assert_eq!(
        sent + dropped,
        log_number(&counters, "envelopes"),
        "{stopped}"
    );
    assert_eq!(sent, whole.len() as u64, "{stopped}");
}

/// stdout that takes every write, slowly (a reader that keeps up at its own pace).
#[derive(Clone)]
struct Slow(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Slow {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::thread::sleep(Duration::from_micros(300));
        let n = buf.len().min(512);
        self.0.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A stdout slower than the envelopes come, and a grace that runs out while the writer is busy
/// (not stuck): every envelope is counted once, as sent or as dropped, and `sent` is what
/// stdout holds whole once the writer has stopped, but for the lines the write in progress at
/// the count ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stdout_at_the_stop_counts_every_envelope_once() {
    use pvp_t140::pvp::{Builder, Kind, SenderId};
    for round in 0..5 {
        let (mut tx, rx) = pvp_t140::handoff::queue(1_000_000);
        let out = Slow(Arc::default());
        let sink = pvp_t140::sink::stdout::StdoutSink::with_writer(
            rx,
            pvp_t140::metrics::SinkMetrics::default(),
            Duration::from_millis(30),
            Box::new(out.clone()),
        )
        .unwrap();
        let mut b = Builder::new("s".into(), None, 1);
        let total = 20_000u64;
        let feeder = std::thread::spawn(move || {
            for i in 0..total {
                let e = b.envelope(
                    pvp_t140::Time::from_millis(1_700_000_000_000 + i),
                    SenderId::from("p"),
                    Kind::ContextAdd,
                    &serde_json::json!({ "i": i }),
                );
                assert_eq!(tx.offer(vec![e]), 0);
            }
        });
        feeder.join().unwrap();
        let stats = sink.close().await;
        // The writer's write in progress ends; nothing is written after it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let bytes = out.0.lock().unwrap().clone();
        let whole = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
        assert_eq!(
            stats.sent + stats.dropped,
            total,
            "round {round}: {stats:?}"
        );
        assert!(
            // The write in progress at the count (512 bytes at most) may end lines after it.
            whole >= stats.sent && whole <= stats.sent + 512 / 100,
            "round {round}: {whole} whole lines, {stats:?}"
        );
    }
}

/// A stdout still taking lines, slowly, when the grace runs out is no failed stdout: after the
/// stop's count the writer writes no more, and that refusal must not set `stdout_failed`, which
/// the exit status reads (a stop after stdout failed exits 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stdout_at_the_stop_is_not_a_failed_one() {
    use pvp_t140::pvp::{Builder, Kind, SenderId};
    let (mut tx, rx) = pvp_t140::handoff::queue(1_000_000);
    let out = Slow(Arc::default());
    let metrics = pvp_t140::metrics::SinkMetrics::default();
    let sink = pvp_t140::sink::stdout::StdoutSink::with_writer(
        rx,
        metrics.clone(),
        Duration::from_millis(30),
        Box::new(out.clone()),
    )
    .unwrap();
    let mut b = Builder::new("s".into(), None, 1);
    let batch: Vec<_> = (0..20_000u64)
        .map(|i| {
            b.envelope(
                pvp_t140::Time::from_millis(1_700_000_000_000 + i),
                SenderId::from("p"),
                Kind::ContextAdd,
                &serde_json::json!({ "i": i }),
            )
        })
        .collect();
    assert_eq!(tx.offer(batch), 0);
    drop(tx);
    let stats = sink.close().await;
    assert!(stats.dropped > 0, "{stats:?}");
    // The write in progress ends, and the writer with it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(metrics.stdout_failed.get(), 0);
}
