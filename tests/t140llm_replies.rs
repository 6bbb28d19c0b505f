//! Found by review ad (session 43): interoperation with the real external sender t140llm 0.0.19
//! (`--compat t140llm`): SRTP payloads, a fixed SSRC's replies from new ports, long stream ids,
//! "[object Object]", replies run together.
//!
//! Two kinds of test: the core driven with the exact bytes t140llm sends (read from its source,
//! or captured from the package itself on loopback), which always run; and the real package
//! (`interop/t140llm`, node) against the real gateway binary over loopback UDP, which need node
//! and `npm install` there, so are `#[ignore]`d like `tests/interop_t140llm.rs`:
//! `cargo test --test t140llm_replies -- --ignored`.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::gateway_proc::Gateway as GatewayProc;
use pvp_t140::{Compat, Config, DropReason, Gateway, rtp};
use serde_json::Value;

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::{addr, at, drain, shown};

const WAIT: Duration = Duration::from_secs(60);

fn t140llm_cfg() -> Config {
    Config {
        compat: Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn interop_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop/t140llm")
}

fn prerequisites() {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "node is not installed"
    );
    assert!(
        interop_dir()
            .join("node_modules/t140llm/package.json")
            .exists(),
        "t140llm is not installed: run `npm install` in interop/t140llm"
    );
}

/// Runs `script` (CommonJS, `PORT` set to the gateway's port, `t` the t140llm package) with
/// node in interop/t140llm against a fresh `--compat t140llm` gateway; returns each
/// participant's context.add contents joined by single spaces, and the gateway's stderr.
fn run_node(script: &str) -> (BTreeMap<String, String>, Vec<String>) {
    prerequisites();
    let mut gw = GatewayProc::start(&[
        "--listen",
        "127.0.0.1:0",
        "--compat",
        "t140llm",
        "--session",
        "review-ad",
    ]);
    let port = gw.listen.port();
    let prelude = format!(
        "const PORT = {port}; const t = require('t140llm'); \
         const {{ PassThrough }} = require('stream'); const dgram = require('dgram');\n"
    );
    let status = Command::new("node")
        .current_dir(interop_dir())
        .args(["-e", &format!("{prelude}{script}")])
        .status()
        .expect("run node");
    assert!(status.success(), "node failed: {status:?}");
    assert!(gw.terminate(WAIT).success());
    let mut transcripts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in gw.stdout_lines() {
        let e: Value = serde_json::from_str(&l).expect("NDJSON");
        if e["type"] == "context.add" {
            transcripts
                .entry(e["sender"].as_str().unwrap().to_owned())
                .or_default()
                .push(e["payload"]["content"].as_str().unwrap().to_owned());
        }
    }
    let joined = transcripts
        .into_iter()
        .map(|(k, v)| (k, v.join(" ")))
        .collect();
    (joined, gw.stderr_lines())
}

// ---- SRTP: t140llm's processAIStreamToSrtp ----------------------------------------------

/// What `processAIStreamToSrtp(feed, '127.0.0.1', port, {masterKey: 16 x 0x07, masterSalt:
/// 14 x 0x09, ssrc: 0x11223344})` sent for the chunks "Hello ", "from ", "an ", "encrypted ",
/// "sender. ", "Bye." (t140llm 0.0.19, werift-rtp 0.8.9, captured on loopback): the RTP header
/// in the clear, the payload AES-CM encrypted with a 10-byte HMAC tag.
const SRTP_PLAIN: [&str; 6] = [
    "8060000000000000112233447a5c005d3a3b07fde49d67cd57748b61",
    "80600001000000a011223344410aebc98f6ffe5bf0574aed202240",
    "8060000200000140112233440fff14894255937be0962dde76",
    "80600003000001e011223344a10e52ca482fbc79a2a9c0dc7db0347be289ce67",
    "8060000400000280112233442f1f4fe719b646ba9f87825628c3ed2fc366",
    "8060000500000320112233448a5b7e571e0bda897f755a2d52b5",
];

/// The same with `redEnabled: true` (first packet PT 96, then PT 98).
const SRTP_RED: [&str; 6] = [
    "8060000000000000112233447a5c005d3a3b07fde49d67cd57748b61",
    "80620001000000a011223344c77824a2cf2faa5c469e955eca364d50fde2d5f4cf33531f0908",
    "8062000200000140112233448e91942fc43c669701490caf2fae83dfcfe7d201ba41703484671de09acee5ff55",
    "80620003000001e011223344246091bbd15e8819a6e826fdd70b428a058332ec2348336b048b3ad1debb6a637230a05349",
    "806200040000028011223344bc7a81899cc528999ca7002e5d7ca7cabd643db01529606dc891b7456d56a46e32371cad611a79dd",
    "8062000500000320112233442822bb7163d334a05735f1ce21f5e0757ae8389e93d107313ed760cca23a4a95e8d4ea959fb6079770",
];

/// t140llm's SRTP mode encrypts the payload; the gateway does not do SRTP (docs/t140llm.md
/// section 9). Its packets were read as T.140 and the ciphertext went into the transcript as
/// U+FFFD and stray characters under a participant that joined for it. t140llm's text is
/// always whole UTF-8 per packet (`Buffer.from(text, 'utf-8')`, cut at grapheme clusters), so
/// a payload that is not is dropped and counted, and no one joins.
#[test]
fn t140llm_srtp_ciphertext_is_a_counted_drop_not_garbage_text() {
    for (name, packets) in [("plain", SRTP_PLAIN), ("red", SRTP_RED)] {
        let mut gw = Gateway::new(t140llm_cfg());
        for (i, p) in packets.iter().enumerate() {
            gw.handle_datagram(at(100 * i as u64), addr(6000), &hex(p));
        }
        gw.shutdown(at(5000));
        let out = drain(&mut gw);
        assert_eq!(shown(&out), Vec::<String>::new(), "{name}");
        assert!(
            !out.iter().any(|e| e.kind == "session.join"),
            "{name}: no participant joins for ciphertext"
        );
        let s = gw.stats();
        assert_eq!(s.drops_total(), 6, "{name}: every packet a counted drop");
        // RED ciphertext may also fail as a RED header chain (`red_block_overrun`).
        assert!(s.drops(DropReason::T140llmNotText) >= 3, "{name}");
    }
}

/// A conformant sender's character split across packets (README "Text decoding") is still
/// whole with `--compat t140llm`: only bytes that are not UTF-8 inside a payload are refused.
#[test]
fn t140llm_compat_still_joins_a_character_split_across_packets() {
    let mut gw = Gateway::new(t140llm_cfg());
    let word = "Grüße.".as_bytes();
    let (a, b) = word.split_at(3); // "Gr" + first byte of "ü"
    for (seq, part) in [(0u16, a), (1, b)] {
        let mut d = Vec::new();
        rtp::write_packet(&mut d, false, 96, seq, u32::from(seq) * 160, 0x55, part);
        gw.handle_datagram(at(u64::from(seq) * 100), addr(6000), &d);
    }
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)), ["Grüße."]);
    assert_eq!(gw.stats().drops_total(), 0);
}

/// t140llm's multiplexing with RED in CSRC mode (docs/t140llm.md section 6) puts the stream's
/// raw CSRC bytes at the start of every redundant block; from the 128th stream a
/// multiplexer has added, they are not UTF-8 (`00 00 00 80`). Such a packet is still read (its
/// primary is text), not dropped as `t140llm_not_text`.
#[test]
fn t140llm_red_blocks_with_raw_csrc_bytes_are_not_refused_as_not_text() {
    let mut gw = Gateway::new(t140llm_cfg());
    gw.handle_datagram(at(0), addr(6000), &t140llm_pkt(0, 0x1122, "Hi "));
    let block = [&[0u8, 0, 0, 0x80][..], b"Hi "].concat();
    let mut p = vec![0x80 | 96, 0, 160, block.len() as u8, 96];
    p.extend_from_slice(&block);
    p.extend_from_slice(b"there.");
    let mut d = Vec::new();
    rtp::write_packet(&mut d, false, 98, 1, 160, 0x1122, &p);
    gw.handle_datagram(at(100), addr(6000), &d);
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)).join(" "), "Hi there.");
    assert_eq!(gw.stats().drops_total(), 0);
}

/// The real package's SRTP mode against the real binary.
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm"]
fn real_t140llm_srtp_sends_no_garbage_and_is_logged() {
    let (t, log) = run_node(
        "const feed = new PassThrough({ objectMode: true });
         const tr = t.processAIStreamToSrtp(feed, '127.0.0.1', PORT,
           { masterKey: Buffer.alloc(16, 7), masterSalt: Buffer.alloc(14, 9) });
         tr.on('error', (e) => console.error(e.message));
         const words = ['Secret ', 'words ', 'go ', 'here. ', 'More ', 'of ', 'them.'];
         let i = 0;
         const step = () => { if (i < words.length) { feed.write(words[i++]); setTimeout(step, 60); }
                              else setTimeout(() => feed.end(), 200); };
         step();",
    );
    assert!(t.is_empty(), "ciphertext became text: {t:?}");
    assert!(
        log.iter()
            .any(|l| l.contains("t140llm_not_text") && l.contains("SRTP")),
        "a clear log line: {log:?}"
    );
}

// ---- a configured SSRC across replies ---------------------------------------------------

/// A t140llm plain packet (PT 96, timestamp +160 a packet, M = 0).
fn t140llm_pkt(seq: u16, ssrc: u32, text: &str) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(
        &mut d,
        false,
        96,
        seq,
        u32::from(seq) * 160,
        ssrc,
        text.as_bytes(),
    );
    d
}

/// A reply as t140llm sends it: `words` one a packet from sequence 0 and timestamp 0, `step`
/// ms apart from `start`, from `port`.
fn reply(gw: &mut Gateway, start: u64, step: u64, port: u16, ssrc: u32, words: &[&str]) {
    for (i, w) in words.iter().enumerate() {
        let t = start + step * i as u64;
        gw.handle_datagram(at(t), addr(port), &t140llm_pkt(i as u16, ssrc, w));
    }
}

/// t140llm takes `ssrc` from its config, but opens a new UDP socket for every reply
/// (`processAIStreamToRtp` makes a `T140RtpTransport`, which makes its own `dgram` socket, and
/// closes it at the reply's end): a bot configured with a fixed SSRC sends each reply from a new
/// port, numbered from sequence 0 and timestamp 0. The second reply was refused as
/// `ssrc_conflict` until the first reply's stream timed out (60 s): its text was lost.
#[test]
fn t140llm_next_reply_with_a_fixed_ssrc_from_a_new_port_is_heard() {
    let mut gw = Gateway::new(t140llm_cfg());
    reply(&mut gw, 0, 100, 6000, 0x1122, &["First ", "reply", "."]);
    // The next reply, 1.5 s on, from the new socket.
    reply(&mut gw, 1500, 100, 6001, 0x1122, &["Second ", "one."]);
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)), ["First reply.", "Second one."]);
    assert_eq!(gw.stats().drops_total(), 0);
}

/// What still is a conflict: the SSRC from another host, or from another port of the host
/// not at a reply's start.
#[test]
fn t140llm_fixed_ssrc_from_another_host_or_mid_reply_is_still_a_conflict() {
    let mut gw = Gateway::new(t140llm_cfg());
    gw.handle_datagram(at(0), addr(6000), &t140llm_pkt(0, 0x1122, "Hi "));
    let other_host: std::net::SocketAddr = "127.0.0.2:6001".parse().unwrap();
    gw.handle_datagram(at(500), other_host, &t140llm_pkt(0, 0x1122, "X"));
    gw.handle_datagram(at(550), addr(6000), &t140llm_pkt(1, 0x1122, "there. "));
    gw.handle_datagram(at(600), addr(6002), &t140llm_pkt(5, 0x1122, "Y"));
    gw.handle_datagram(at(650), addr(6000), &t140llm_pkt(2, 0x1122, "Bye."));
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)).join(" "), "Hi there. Bye.");
    assert_eq!(gw.stats().drops(DropReason::SsrcConflict), 2);
}

/// Replies back to back, as an agent chains them: the next reply's first packet comes one
/// pacer tick (100 ms) after the last reply's stream ended, about 150 ms after its last packet
/// (seen with the real package: the second reply was lost as `ssrc_conflict`).
#[test]
fn t140llm_back_to_back_replies_with_a_fixed_ssrc_are_all_heard() {
    let mut gw = Gateway::new(t140llm_cfg());
    let mut t = 0;
    for (port, reply) in [
        (6000, "First reply."),
        (6001, "Second one."),
        (6002, "Third."),
    ] {
        gw.handle_datagram(at(t), addr(port), &t140llm_pkt(0, 0x1122, reply));
        t += 150;
    }
    gw.shutdown(at(5000));
    assert_eq!(
        shown(&drain(&mut gw)),
        ["First reply.", "Second one.", "Third."]
    );
    assert_eq!(gw.stats().drops_total(), 0);
}

/// The real package: two replies in a row, each `processAIStreamToRtp` with `ssrc` set.
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm"]
fn real_t140llm_two_replies_with_a_fixed_ssrc_both_arrive() {
    let (t, _) = run_node(
        "function reply(text, then) {
           const feed = new PassThrough({ objectMode: true });
           const tr = t.processAIStreamToRtp(feed, '127.0.0.1', PORT, { ssrc: 0x11223344 });
           tr.udpSocket.once('close', then);
           feed.write(text);
           setTimeout(() => feed.end(), 150);
         }
         reply('First reply.', () => reply('Second one.', () => {}));",
    );
    let mut got: Vec<&String> = t.values().collect();
    got.sort();
    assert_eq!(got, ["First reply.", "Second one."], "{t:?}");
}

// ---- known gaps -------------------------------------------------------------------------

/// t140llm's `processBackspaces` keeps all the text it sent, backspaces applied, and sends it
/// whole again when the source stream ends (`if (textBuffer) callbacks.sendText(textBuffer)`,
/// docs/t140llm.md deviation 11). With its own socket that last packet is usually lost; with a
/// custom transport, or `processAIStreamToDirectSocket`/SRTP, it arrives, and the whole reply
/// is shown twice (seen with the real package: "Hello worLD.Hello worLD."). These are the
/// direct-socket path's packets for the chunks "Hello wor", "ld\b\bLD.".
#[test]
#[ignore = "known gap: t140llm's processBackspaces re-sends the whole reply at its end; telling \
            that packet from new text needs the reply's whole text kept per speaker"]
fn t140llm_process_backspaces_resend_is_not_shown_twice() {
    let mut gw = Gateway::new(t140llm_cfg());
    reply(
        &mut gw,
        0,
        150,
        6000,
        0x77,
        &["Hello wor", "ld\u{8}\u{8}LD.", "Hello worLD."],
    );
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)).join(" "), "Hello worLD.");
}

/// With one socket for every reply (a `customTransport`) and a fixed `ssrc`, each reply starts
/// again at sequence 0 and timestamp 0 from the same source. The gateway took that for a new
/// reply only after a quiet spell longer than the reorder wait: a reply that starts sooner
/// (here 400 ms after the last one's last packet) was dropped as stale. Since review be its
/// packet 0, not the bytes of the last one's, starts it (tests/t140llm_reply_starts.rs).
#[test]
fn t140llm_reply_through_the_same_socket_soon_after_the_last_is_heard() {
    let mut gw = Gateway::new(t140llm_cfg());
    reply(&mut gw, 0, 100, 6000, 0x1122, &["First ", "reply", "."]);
    reply(&mut gw, 600, 100, 6000, 0x1122, &["Second ", "one."]);
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)).join(" "), "First reply. Second one.");
}

// ---- multiplexed stream ids -------------------------------------------------------------

/// A Vertex AI model's resource name, 85 bytes: an id t140llm takes as any other.
const LONG_ID: &str =
    "projects/my-project/locations/us-central1/publishers/google/models/gemini-1.5-pro-002";

/// t140llm's multiplexer takes any string as a stream id and sends `<id>` 0x1E before every
/// packet's text (docs/t140llm.md section 6). An id over 64 bytes was taken for text: it went
/// into the transcript before every packet's text, under the stream's SSRC participant, and
/// streams so named ran together there.
#[test]
fn t140llm_stream_id_over_64_bytes_is_a_participant_not_text() {
    let mut gw = Gateway::new(t140llm_cfg());
    let short = "beta";
    for (seq, id, text) in [
        (0u16, LONG_ID, "Hi "),
        (1, short, "Yo "),
        (2, LONG_ID, "all."),
        (3, short, "there."),
    ] {
        let payload = format!("{id}\u{1e}{text}");
        gw.handle_datagram(
            at(100 * u64::from(seq)),
            addr(6000),
            &t140llm_pkt(seq, 0x55, &payload),
        );
    }
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    let adds: Vec<(String, String)> = out
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| {
            let sender = e.sender.rsplit_once('/').unwrap().1.to_owned();
            (sender, e.payload["content"].as_str().unwrap().to_owned())
        })
        .collect();
    let escaped = LONG_ID.replace('/', "%2F");
    assert!(
        adds.contains(&(escaped.clone(), "Hi all.".to_owned())),
        "{adds:?}"
    );
    assert!(
        adds.contains(&(short.to_owned(), "Yo there.".to_owned())),
        "{adds:?}"
    );
    assert_eq!(adds.len(), 2, "{adds:?}");
}

/// The real package's multiplexer with that id.
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm"]
fn real_t140llm_multiplexed_long_stream_id_is_its_own_participant() {
    let (t, _) = run_node(&format!(
        "const mux = t.createT140RtpMultiplexer('127.0.0.1', PORT, {{}});
         const ids = ['{LONG_ID}', 'beta']; let left = ids.length;
         mux.on('streamRemoved', () => {{ left -= 1; if (left === 0) setTimeout(() => mux.close(), 50); }});
         for (const id of ids) {{
           const feed = new PassThrough({{ objectMode: true }});
           t.addAIStreamToMultiplexer(mux, id, feed);
           feed.write('Hello from ' + id.length + ' bytes.');
           setTimeout(() => feed.end(), 2500);
         }}"
    ));
    let escaped = LONG_ID.replace('/', "%2F");
    let by_id: BTreeMap<String, String> = t
        .into_iter()
        .map(|(k, v)| {
            (
                k.rsplit_once('/').map_or(k.clone(), |(_, s)| s.to_owned()),
                v,
            )
        })
        .collect();
    assert_eq!(
        by_id.get(&escaped).map(String::as_str),
        Some("Hello from 85 bytes."),
        "{by_id:?}"
    );
    assert_eq!(
        by_id.get("beta").map(String::as_str),
        Some("Hello from 4 bytes."),
        "{by_id:?}"
    );
    assert_eq!(by_id.len(), 2, "{by_id:?}");
}

// ---- a reply's first packets lost --------------------------------------------------------

/// t140llm RED (docs/t140llm.md section 5): 16-bit offset, 8-bit length, newest first.
fn t140llm_red(seq: u16, gens_newest_first: &[&str], primary: &str) -> Vec<u8> {
    let p = core_helpers::t140llm_red_payload(gens_newest_first, primary);
    let mut d = Vec::new();
    rtp::write_packet(&mut d, false, 98, seq, u32::from(seq) * 160, 0x1122, &p);
    d
}

/// A t140llm RED reply whose first packets were lost: its first packet (plain, "Hel") and
/// second (RED, "lo ") never came; the third carries both as redundancy. Redundancy is there
/// for exactly this; the reply must read whole.
#[test]
fn t140llm_red_reply_whose_first_packets_were_lost_is_recovered() {
    for lost in [1u16, 2] {
        let mut gw = Gateway::new(t140llm_cfg());
        let packets = [
            t140llm_pkt(0, 0x1122, "Hel"),
            t140llm_red(1, &["Hel"], "lo "),
            t140llm_red(2, &["lo ", "Hel"], "fro"),
            t140llm_red(3, &["fro", "lo "], "m t140llm."),
        ];
        for (i, p) in packets.iter().enumerate().skip(usize::from(lost)) {
            gw.handle_datagram(at(100 * i as u64), addr(6000), p);
        }
        gw.shutdown(at(5000));
        assert_eq!(
            shown(&drain(&mut gw)).join(" "),
            "Hello from t140llm.",
            "first {lost} lost"
        );
    }
}

/// A plain t140llm reply (no redundancy) whose first packet was lost: t140llm numbers every
/// reply from sequence 0 and timestamp 0 (+160 a packet), so a stream whose first packet is
/// sequence 1 at timestamp 160 lost its head (RFC 4103 5.3 wants the loss shown). Since
/// review ar the lost head is counted (`head_lost`, and its loss as `lost_unattributed`:
/// tests/review_ar.rs), not marked: at the head no voice is certain to be the lost packet's.
#[test]
#[ignore = "known gap: with --compat t140llm a lost first packet of a reply is counted \
            (head_lost, lost_unattributed), not marked: the stream has no voice yet, and in \
            t140llm's multiplexing the name went with the lost packet"]
fn t140llm_plain_reply_whose_first_packet_was_lost_is_marked() {
    let mut gw = Gateway::new(t140llm_cfg());
    gw.handle_datagram(at(100), addr(6000), &t140llm_pkt(1, 0x1122, "lo "));
    gw.handle_datagram(at(200), addr(6000), &t140llm_pkt(2, 0x1122, "there."));
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)).join(" "), "\u{fffd}lo there.");
    assert_eq!(gw.stats().lost, 1);
}

// ---- LLM SDK chunks t140llm cannot read ---------------------------------------------------

/// t140llm takes a chunk's text from the shapes it knows (`extractTextFromChunk`), and for
/// any other object sends `chunk.toString()`: "[object Object]". OpenAI's last chunk of every
/// streamed reply (`{choices: [{delta: {}, finish_reason: "stop"}]}`) is such an object, and so
/// are Anthropic's `message_start`, `content_block_start`, `content_block_stop`,
/// `message_delta` and `message_stop` events: every reply's transcript ended in
/// "[object Object]" (seen with the real package, below). t140llm's pacer cuts it across
/// packets like any text.
#[test]
fn t140llm_object_object_is_kept_out_of_the_transcript() {
    let mut gw = Gateway::new(t140llm_cfg());
    let anthropic_start = "[object Object][object Object]";
    let words = [
        &anthropic_start[..20],
        &anthropic_start[20..],
        "Hello",
        " there.[obj",
        "ect Object]",
    ];
    reply(&mut gw, 0, 100, 6000, 0x99, &words);
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)), ["Hello there."]);
    assert_eq!(gw.stats().t140llm_objects, 3);
}

/// Without `--compat t140llm` the text is the sender's: nothing is taken out.
#[test]
fn object_object_from_a_conformant_sender_is_text() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(
        at(0),
        addr(4000),
        &core_helpers::t140(1, 7, "It printed [object Object]."),
    );
    gw.shutdown(at(5000));
    assert_eq!(shown(&drain(&mut gw)), ["It printed [object Object]."]);
}

/// The real package fed an OpenAI SDK stream's chunks.
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm"]
fn real_t140llm_fed_openai_chunks_sends_no_object_object_into_the_transcript() {
    let (t, _) = run_node(
        "const feed = new PassThrough({ objectMode: true });
         t.processAIStreamToRtp(feed, '127.0.0.1', PORT, {});
         const c = (delta, finish_reason = null) =>
           ({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason }] });
         const chunks = [c({ role: 'assistant', content: '' }), c({ content: 'Hello' }),
                         c({ content: ' there.' }), c({}, 'stop')];
         let i = 0;
         const step = () => { if (i < chunks.length) { feed.write(chunks[i++]); setTimeout(step, 100); }
                              else setTimeout(() => feed.end(), 1500); };
         step();",
    );
    assert_eq!(t.values().collect::<Vec<_>>(), ["Hello there."], "{t:?}");
}

/// The real package fed an Anthropic SDK stream's events: six of them are objects t140llm
/// cannot read, around the text.
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm"]
fn real_t140llm_fed_anthropic_events_sends_only_the_text() {
    let (t, _) = run_node(
        "const feed = new PassThrough({ objectMode: true });
         t.processAIStreamToRtp(feed, '127.0.0.1', PORT, {});
         const text = (s) => ({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: s } });
         const chunks = [
           { type: 'message_start', message: { id: 'm', role: 'assistant', content: [] } },
           { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
           { type: 'ping' }, text('Hello'), text(' world. How are'), text(' you?'),
           { type: 'content_block_stop', index: 0 },
           { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 5 } },
           { type: 'message_stop' }];
         let i = 0;
         const step = () => { if (i < chunks.length) { feed.write(chunks[i++]); setTimeout(step, 60); }
                              else setTimeout(() => feed.end(), 4000); };
         step();",
    );
    assert_eq!(
        t.values().collect::<Vec<_>>(),
        ["Hello world. How are you?"],
        "{t:?}"
    );
}

/// Replies through one socket and a fixed SSRC, the next started 1.5 s after the last one's
/// last packet (past the reorder wait, so it is taken for a new reply: README "Receiving",
/// "Sequence"; before the 2 s idle flush). The last reply's text was still buffered and ran
/// into the next as one item, "First reply here.Second one." (seen with the real package
/// through a custom transport): a reply's start ends the last reply's item.
#[test]
fn t140llm_reply_start_through_the_same_socket_ends_the_last_replys_item() {
    let mut gw = Gateway::new(t140llm_cfg());
    reply(
        &mut gw,
        0,
        100,
        6000,
        0x1122,
        &["First ", "reply ", "here."],
    );
    reply(&mut gw, 1700, 100, 6000, 0x1122, &["Second ", "one."]);
    gw.shutdown(at(6000));
    assert_eq!(shown(&drain(&mut gw)), ["First reply here.", "Second one."]);
}

/// The real package: two replies through one custom transport with a fixed SSRC, the second
/// started about 1.5 s after the first's last packet.
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm"]
fn real_t140llm_replies_through_one_socket_are_separate_items() {
    let (t, _) = run_node(
        "const sock = dgram.createSocket('udp4');
         const ct = { send(p, cb) { sock.send(p, PORT, '127.0.0.1', cb); }, close() {} };
         function reply(text, then) {
           const feed = new PassThrough({ objectMode: true });
           t.processAIStreamToRtp(feed, '127.0.0.1', PORT, { customTransport: ct, ssrc: 0x11223344 });
           feed.write(text);
           setTimeout(() => { feed.end(); setTimeout(then, 300); }, 1200);
         }
         reply('First reply here.', () => reply('Second one.', () => setTimeout(() => sock.close(), 300)));",
    );
    let items: Vec<&String> = t.values().collect();
    assert_eq!(items, ["First reply here. Second one."], "{t:?}");
}
