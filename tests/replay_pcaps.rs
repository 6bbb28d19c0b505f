//! Replays every real loopback capture in `pcaps/` through the `pvp-t140 replay` binary and
//! compares the envelopes with the capture's `.expected.jsonl` exactly (ids and timestamps
//! excluded, since those are the only values that differ between runs).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn pcaps() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pcaps")
}

/// The comparable projection of an envelope: type, sender, and for context.add the content and
/// the flush cause.
fn project(e: &Value) -> Value {
    let mut o = json!({ "type": e["type"], "sender": e["sender"] });
    if e["type"] == "context.add" {
        o["content"] = e["payload"]["content"].clone();
        let flush = e["payload"]["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|t| t.strip_prefix("flush:"))
            .expect("flush tag");
        o["flush"] = json!(flush);
    }
    o
}

fn replay(capture: &Path) -> Vec<Value> {
    replay_with(capture, &[])
}

fn replay_with(capture: &Path, args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(capture)
        .args(["--session", "replay-test"])
        .args(args)
        .output()
        .expect("run pvp-t140 replay");
    assert!(
        out.status.success(),
        "replay of {} failed: {}",
        capture.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("stdout is UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

fn expected(name: &str) -> Vec<Value> {
    let path = pcaps().join(format!("{name}.expected.jsonl"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("expected line is JSON"))
        .collect()
}

fn check(capture: &str, name: &str) {
    check_with(capture, name, &[]);
}

fn check_with(capture: &str, name: &str, args: &[&str]) {
    let envelopes = replay_with(&pcaps().join(capture), args);
    for e in &envelopes {
        assert_eq!(e["v"], 1);
        assert_eq!(e["session"], "replay-test");
        assert_eq!(e["id"].as_str().map(str::len), Some(26), "ULID id: {e}");
    }
    let got: Vec<Value> = envelopes.iter().map(project).collect();
    let want = expected(name);
    assert_eq!(
        got,
        want,
        "\n{capture}: got\n{}\nwant\n{}",
        got.iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        want.iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn single_stream_flushes_on_sentence_idle_and_end() {
    check("single.pcap", "single");
}

#[test]
fn pcapng_with_linux_sll2_link_type() {
    check("single_any.pcapng", "single_any");
}

#[test]
fn two_interleaved_ssrcs_are_two_participants() {
    check("two_ssrc.pcap", "two_ssrc");
}

#[test]
fn red_primary_blocks_without_duplicates() {
    check("red.pcap", "red");
}

#[test]
fn non_ascii_text_split_across_packets_and_invalid_bytes() {
    check("unicode.pcap", "unicode");
}

#[test]
fn backspace_new_lines_and_controls() {
    check("backspace.pcap", "backspace");
}

#[test]
fn ipv6_source() {
    check("ipv6.pcap", "ipv6");
}

#[test]
fn sequence_number_wraparound() {
    check("wrap.pcap", "wrap");
}

#[test]
fn malformed_datagrams_are_dropped_and_valid_text_survives() {
    // One valid packet there carries a CSRC from a plain sender, not a mixer.
    check_with("malformed.pcap", "malformed", &["--mixer", "off"]);
}

#[test]
fn idle_flush_timestamps_follow_the_capture_clock() {
    // In single.pcap the first idle flush fires ~2 s into a 2.5 s silence: its ts is the moment
    // the idle timer expired on the capture's clock, strictly between its neighbours' ts.
    let envelopes = replay(&pcaps().join("single.pcap"));
    let ts: Vec<&str> = envelopes
        .iter()
        .map(|e| e["ts"].as_str().unwrap())
        .collect();
    let mut sorted = ts.clone();
    sorted.sort();
    assert_eq!(ts, sorted, "envelope timestamps go forward");
    let idle = envelopes
        .iter()
        .position(|e| e["payload"]["tags"].to_string().contains("flush:idle"))
        .expect("an idle flush");
    assert!(ts[idle] > ts[idle - 1]);
    assert!(ts[idle] < ts[idle + 1]);
}

#[test]
fn not_a_capture_is_a_clear_error() {
    let path = std::env::temp_dir().join(format!("pvp-t140-notpcap-{}", std::process::id()));
    std::fs::write(&path, b"this is not a capture file at all").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a readable pcap/pcapng capture"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["replay", "/nonexistent/file.pcap"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// A directory given as the capture is reported as what it is, "Is a directory", not as a
/// file of the wrong format (review, session 32: pcap-parser's bare `ReadError` was reported
/// as "not a readable pcap/pcapng capture").
#[test]
fn a_directory_given_as_the_capture_says_so() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-replay-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&dir)
        .output()
        .unwrap();
    std::fs::remove_dir(&dir).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Is a directory") && !err.contains("not a readable pcap/pcapng capture"),
        "{err}"
    );
}

// t140llm 0.0.19's real output (interop/t140llm/capture.sh), replayed with --compat t140llm.

#[test]
fn t140llm_plain_capture() {
    check_with(
        "t140llm_plain.pcap",
        "t140llm_plain",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_red_newest_first_capture() {
    check_with(
        "t140llm_red3.pcap",
        "t140llm_red3",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_red_with_three_lost_packets_recovers_everything() {
    check_with(
        "t140llm_red3_loss.pcap",
        "t140llm_red3_loss",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_red_with_four_lost_packets_marks_the_one_it_cannot_recover() {
    check_with(
        "t140llm_red3_loss4.pcap",
        "t140llm_red3_loss4",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_multiplexed_prefix_capture() {
    check_with(
        "t140llm_multiplex_prefix.pcap",
        "t140llm_multiplex_prefix",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_multiplexed_csrc_capture() {
    check_with(
        "t140llm_multiplex_csrc.pcap",
        "t140llm_multiplex_csrc",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_metadata_capture() {
    check_with(
        "t140llm_direct_metadata.pcap",
        "t140llm_direct_metadata",
        &["--compat", "t140llm"],
    );
}

#[test]
fn t140llm_without_compat_is_refused_not_misread() {
    // Its payload types are not the RFC defaults here: counted drops, never garbage text.
    let envelopes = replay(&pcaps().join("t140llm_plain.pcap"));
    assert!(envelopes.is_empty(), "{envelopes:?}");
}

// Loss, reordering, restarts, RTCP, mixers and T.140 controls (tools/make_pcaps.py; expected
// output derived by hand from what was sent, see tools/README-pcaps.md).

/// Envelopes of one type from one sender.
fn of<'a>(envelopes: &'a [Value], kind: &str, sender: &str) -> Vec<&'a Value> {
    envelopes
        .iter()
        .filter(|e| e["type"] == kind && e["sender"] == sender)
        .collect()
}

/// Every context.add content, concatenated.
fn all_text(envelopes: &[Value]) -> String {
    envelopes
        .iter()
        .filter(|e| e["type"] == "context.add")
        .map(|e| e["payload"]["content"].as_str().unwrap())
        .collect()
}

#[test]
fn red_loss_recovers_what_redundancy_holds_and_marks_the_one_packet_it_does_not() {
    // Two lost packets both in the next packet's redundancy; then three lost in a row, of
    // which only the first is in no later packet: exactly one U+FFFD, in its place.
    check("loss_red.pcap", "loss_red");
    let text = all_text(&replay(&pcaps().join("loss_red.pcap")));
    assert_eq!(text.matches('\u{fffd}').count(), 1, "{text}");
}

#[test]
fn plain_loss_is_one_mark_after_the_reorder_wait() {
    check("loss_plain.pcap", "loss_plain");
}

#[test]
fn reordered_and_duplicated_plain_and_red_packets_give_an_exact_transcript() {
    check("reorder.pcap", "reorder");
    let text = all_text(&replay(&pcaps().join("reorder.pcap")));
    assert!(!text.contains('\u{fffd}'), "{text}");
}

#[test]
fn a_sender_restarting_with_a_new_ssrc_is_a_second_participant() {
    check("ssrc_change.pcap", "ssrc_change");
    let envelopes = replay(&pcaps().join("ssrc_change.pcap"));
    let ssrcs: Vec<&Value> = envelopes
        .iter()
        .filter(|e| e["type"] == "session.join")
        .map(|e| &e["payload"]["participant"]["metadata"]["ssrc"])
        .collect();
    assert_eq!(ssrcs, [&json!("5eed0001"), &json!("5eed0002")]);
}

#[test]
fn rtcp_on_the_next_port_names_the_join_and_its_bye_leaves_after_the_reorder_wait() {
    check("rtcp.pcap", "rtcp");
    // The capture ends 301 ms after the BYE: a 200 ms reorder wait ends before it.
    let envelopes = replay_with(&pcaps().join("rtcp.pcap"), &["--reorder-wait-ms", "200"]);
    let ada = "t140:c0ffee01@127.0.0.1:40000";
    // SDES (CNAME + NAME) arrived on :5005 before the first RTP packet: NAME is in the join.
    let join = of(&envelopes, "session.join", ada);
    assert_eq!(join[0]["payload"]["participant"]["name"], "Ada Lovelace");
    // The same NAME again later announces nothing; the CNAME-only SDES in the BYE compound
    // does not demote it.
    assert!(
        !envelopes
            .iter()
            .any(|e| e["type"] == "participant.announce"),
        "{envelopes:?}"
    );
    // BYE (captured at 00.545): once the reorder wait from it is over (a last packet the BYE
    // overtook would still be taken), the pending text is flushed and the participant leaves,
    // not at the end.
    let leave = of(&envelopes, "session.leave", ada);
    assert_eq!(leave[0]["payload"]["reason"], "rtcp bye");
    let last_add = of(&envelopes, "context.add", ada).pop().unwrap();
    assert_eq!(last_add["payload"]["content"], "Leaving now");
    assert_eq!(last_add["ts"], "2026-11-22T19:58:00.745Z");
    assert_eq!(leave[0]["ts"], "2026-11-22T19:58:00.745Z");
    let end = envelopes.last().unwrap();
    assert!(leave[0]["ts"].as_str() < end["ts"].as_str(), "{end}");
}

#[test]
fn rtcp_mux_sdes_after_the_first_rtp_packet_announces_the_name() {
    let envelopes = replay(&pcaps().join("rtcp_mux.pcap"));
    let (cy, dan) = (
        "t140:c0ffee03@127.0.0.1:40000",
        "t140:c0ffee04@127.0.0.1:40002",
    );
    // NAME wins over CNAME; a CNAME alone names the participant.
    let last_name = |sender| {
        of(&envelopes, "participant.announce", sender)
            .last()
            .map(|e| e["payload"]["name"].clone())
    };
    assert_eq!(last_name(cy), Some(json!("Cyrus")));
    assert_eq!(last_name(dan), Some(json!("dan@127.0.0.1")));
    let leave = of(&envelopes, "session.leave", cy);
    assert_eq!(leave[0]["payload"]["reason"], "rtcp bye");
    assert_eq!(
        of(&envelopes, "session.leave", dan)[0]["payload"]["reason"],
        "gateway shutdown"
    );
}

#[test]
fn rtcp_mux_capture() {
    check("rtcp_mux.pcap", "rtcp_mux");
}

#[test]
fn rfc9071_mixer_csrcs_are_speakers_and_redundancy_is_placed_per_speaker() {
    // One SSRC, one sequence, one CSRC per packet; B's lost packet comes back from B's next
    // packet's redundancy (placed by timestamp), nothing is repeated and nothing is marked.
    check("mixer.pcap", "mixer");
    let envelopes = replay(&pcaps().join("mixer.pcap"));
    let joins: Vec<(&Value, &Value)> = envelopes
        .iter()
        .filter(|e| e["type"] == "session.join")
        .map(|e| {
            let m = &e["payload"]["participant"]["metadata"];
            (&m["ssrc"], &m["csrc"])
        })
        .collect();
    assert_eq!(
        joins,
        [
            (&json!("90710000"), &json!("0000000a")),
            (&json!("90710000"), &json!("0000000b")),
            (&json!("90710000"), &json!("0000000c")),
        ]
    );
    assert!(!all_text(&envelopes).contains('\u{fffd}'));
}

#[test]
fn t140_controls_are_skipped_and_a_backspace_into_sent_text_updates_it() {
    check("controls.pcap", "controls");
    let envelopes = replay(&pcaps().join("controls.pcap"));
    let sender = "t140:c7c7c7c7@127.0.0.1:40000";
    let sent = of(&envelopes, "context.add", sender)
        .into_iter()
        .find(|e| e["payload"]["content"] == "Send it now.")
        .expect("the sentence that is corrected");
    let update = of(&envelopes, "context.update", sender);
    assert_eq!(update.len(), 1);
    // 5 backspaces: the space after the sentence (never sent), then ".", "w", "o", "n".
    assert_eq!(update[0]["payload"]["key"], sent["payload"]["key"]);
    assert_eq!(update[0]["payload"]["new_content"], "Send it");
    let text = all_text(&envelopes);
    for debris in ["[", "\u{1b}", "\u{9b}", "hidden", "\u{7}", "\r"] {
        assert!(!text.contains(debris), "{debris:?} in {text:?}");
    }
}

#[test]
fn a_pcapng_block_shorter_than_its_header_is_an_error_not_a_panic() {
    // Found by the pcap_read fuzz target: pcap-parser 0.17 underflows on this block.
    let crash = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus/pcap_read/crash-pcapng-pib-len8-underflow");
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&crash)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("shorter than its own header"));
}

/// `dumpcap -i any -y LINUX_SLL2 -s 61 -n`: three 63-byte frames (RTP "Hel", "lo.", "Bye")
/// each cut to 61 bytes, so every RTP payload lost its last two bytes. The EPB pads 61 to 64
/// with zeros, and those must not be read as the datagram's end: each datagram is cut short,
/// so it is skipped, and nothing is replayed (not "HlB", text that was never sent).
#[test]
fn datagrams_cut_by_the_snap_length_in_an_sll2_pcapng_are_skipped() {
    check("sll2_cut_by_snaplen.pcapng", "sll2_cut_by_snaplen");
}

/// t140llm 0.0.19's real sender: `send.mjs --mode multiplex --text "Hi there."
/// --stream-id "openai/gpt-4o,anthropic/claude-3" --ssrc 287454020`. A model name is the
/// natural stream id: each must be a participant of its own (the `/` percent-encoded in the
/// participant id), and no id may show in the text.
#[test]
fn t140llm_multiplexed_ids_with_a_slash_are_separate_participants() {
    check_with(
        "t140llm_multiplex_slash_ids.pcap",
        "t140llm_multiplex_slash_ids",
        &["--compat", "t140llm"],
    );
}

/// `t140llm_multiplex_prefix.pcap` with its third packet (alpha "A.") removed (editcap): the
/// loss must not make a participant of the stream's SSRC, which no one speaks as (also
/// `tests/replay.rs`, `t140llm_multiplex_loss_does_not_invent_a_participant`).
#[test]
fn t140llm_multiplex_loss_does_not_add_a_phantom_participant() {
    let envelopes = replay_with(
        &pcaps().join("t140llm_multiplex_prefix_loss.pcap"),
        &["--compat", "t140llm"],
    );
    let joined: Vec<&str> = envelopes
        .iter()
        .filter(|e| e["type"] == "session.join")
        .map(|e| e["sender"].as_str().unwrap())
        .collect();
    assert_eq!(joined.len(), 2, "only alpha and beta exist: {joined:?}");
    assert!(
        joined
            .iter()
            .all(|s| s.ends_with("/alpha") || s.ends_with("/beta")),
        "{joined:?}"
    );
}

/// A live gateway on :5004 reads RTCP on :5005 too (`--rtcp true` by default). Replaying the
/// same capture with `--port 5004` must give the same envelopes: dropping the :5005 RTCP
/// would lose Ada's NAME and her BYE ("gateway shutdown" instead of "rtcp bye").
#[test]
fn replay_port_filter_keeps_the_rtcp_port_a_live_gateway_reads() {
    let all = replay(&pcaps().join("rtcp.pcap"));
    let filtered = replay_with(&pcaps().join("rtcp.pcap"), &["--port", "5004"]);
    let p = |v: &[Value]| v.iter().map(project).collect::<Vec<_>>();
    assert_eq!(p(&filtered), p(&all));
    let leave = of(&filtered, "session.leave", "t140:c0ffee01@127.0.0.1:40000");
    assert_eq!(leave[0]["payload"]["reason"], "rtcp bye");
    // The port after 5005 is not what a gateway on 5004 reads: nothing is left.
    let none = replay_with(&pcaps().join("rtcp.pcap"), &["--port", "5005"]);
    assert_eq!(p(&none), p(&[]), "RTCP alone makes no envelopes");
}
