//! A stdout nobody reads (a stuck pipeline) must not keep the gateway from stopping: on SIGTERM
//! it waits the grace (5 s) for the writer, then exits and counts what it could not write as
//! dropped. Before, it hung until the reader went away, and counted those envelopes as neither.

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};

const WAIT: Duration = Duration::from_secs(30);

fn field(line: &str, name: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    v["fields"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {line}"))
}

#[test]
fn sigterm_with_an_unread_stdout_exits_after_the_grace_and_counts_the_unwritten() {
    let mut gw = Gateway::start_unread(&["--listen", "127.0.0.1:0", "--rtcp", "false"]);
    let mut a = Sender::new(gw.listen, 0x5eed_0001);
    // 400 chunks of about 500 bytes of JSON each: more than the pipe (64 KiB) and the writer's
    // buffer (64 KiB) hold together. Ten sentences a datagram, so that the burst fits even a
    // default-sized socket buffer (net.core.rmem_max 208 KiB).
    for i in 0..40 {
        let text: String = (0..10)
            .map(|j| {
                format!(
                    "Sentence number {} is here, and it is long enough to fill the pipe. ",
                    i * 10 + j
                )
            })
            .collect();
        a.send(&text);
    }
    // Datagrams are handled in arrival order: once a later sender's chunk makes it join, all
    // 400 chunks have been made.
    let mut b = Sender::new(gw.listen, 0x5eed_0002);
    b.send("The last one. ");
    gw.wait_stderr(WAIT, &b.participant());

    let status = gw.terminate(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let lines = gw.stderr_lines();
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("\"message\":\"{message}\"")))
            .unwrap_or_else(|| panic!("no {message:?} line in\n{}", lines.join("\n")))
            .clone()
    };
    let envelopes = field(&find("counters"), "envelopes");
    let stopped = find("stopped");
    let (sent, dropped) = (field(&stopped, "sent"), field(&stopped, "dropped"));
    assert!(envelopes > 400, "joins, 401 chunks, leaves: {envelopes}");
    assert!(dropped > 0, "the pipe cannot hold them all: {stopped}");
    assert_eq!(
        sent + dropped,
        envelopes,
        "every envelope accounted for: {stopped}"
    );
    assert!(
        lines.iter().any(|l| l.contains("did not finish within")),
        "the grace ran out, and the log says so"
    );
}
