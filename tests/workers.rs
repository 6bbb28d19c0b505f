//! `--workers N`: several SO_REUSEPORT receive loops, each on a thread of its own. Many sources
//! at once: every stream's transcript arrives whole and in order, whichever worker it landed on.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use serde_json::Value;

#[test]
fn many_sources_over_four_workers_keep_per_stream_order() {
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "4",
        "--idle-flush-ms",
        "60000",
    ]);
    let mut senders: Vec<Sender> = (0..24)
        .map(|i| Sender::new(gw.listen, 0x1000 + i))
        .collect();
    // Each stream counts "w0 w1 ... w39." one word per packet, interleaved across streams.
    for w in 0..40 {
        for s in &mut senders {
            s.send(&format!("w{w}{}", if w == 39 { ". " } else { " " }));
        }
        // Pace a little so the kernel buffer is never the test's subject.
        std::thread::sleep(Duration::from_millis(2));
    }
    let expected: String = (0..40)
        .map(|w| format!("w{w}"))
        .collect::<Vec<_>>()
        .join(" ")
        + ".";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gw
        .stdout_lines()
        .iter()
        .filter(|l| l.contains("\"context.add\""))
        .count()
        < senders.len()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not all streams flushed: {:?}",
            gw.stdout_lines().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // One thread per receive worker, each named for it.
    let rx: Vec<String> = gw
        .thread_names()
        .into_iter()
        .filter(|n| n.starts_with("pvp-rx-"))
        .collect();
    assert_eq!(rx, ["pvp-rx-0", "pvp-rx-1", "pvp-rx-2", "pvp-rx-3"]);
    assert!(gw.terminate(Duration::from_secs(20)).success());
    let mut by_sender: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in gw.stdout_lines() {
        let e: Value = serde_json::from_str(&l).unwrap();
        if e["type"] == "context.add" {
            by_sender
                .entry(e["sender"].as_str().unwrap().to_owned())
                .or_default()
                .push(e["payload"]["content"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(by_sender.len(), senders.len());
    for (sender, texts) in &by_sender {
        assert_eq!(texts, std::slice::from_ref(&expected), "{sender}");
    }
    let stderr = gw.stderr_lines().join("\n");
    assert!(stderr.contains("\"workers\":4"), "{stderr}");
}

/// `--max-streams` bounds the gateway, not each receive worker (README's flag table: "new
/// streams beyond this are refused and counted"): 16 senders, `--max-streams 1`, 4 workers;
/// one participant joins, the other 15 are refused and counted as `stream_limit`. A review
/// found every worker's core had the whole limit, so as many joined as there were workers the
/// senders hashed onto (review, session 33).
#[test]
fn max_streams_bounds_the_gateway_not_each_receive_worker() {
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "4",
        "--max-streams",
        "1",
        "--max-pps-per-source",
        "0",
    ]);
    let mut senders: Vec<Sender> = (0..16)
        .map(|i| Sender::new(gw.listen, 0x5000 + i))
        .collect();
    // Whichever comes first is the one admitted.
    for (i, s) in senders.iter_mut().enumerate() {
        s.send(&format!("Speaker {i} says hello. "));
    }
    gw.wait_stdout(Duration::from_secs(20), "\"context.add\"");
    // What the kernel holds is read at the stop, then every stream flushes and leaves.
    assert!(gw.terminate(Duration::from_secs(20)).success());
    let joined: std::collections::BTreeSet<String> = gw
        .stdout_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "session.join")
        .map(|e| e["sender"].as_str().unwrap_or_default().to_owned())
        .collect();
    let counters = gw
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("\"counters\""))
        .unwrap_or_default();
    assert_eq!(
        joined.len(),
        1,
        "--max-streams 1 with --workers 4 let {} participants join: {joined:?}\n{counters}",
        joined.len()
    );
    assert!(counters.contains("stream_limit=15"), "{counters}");
}
