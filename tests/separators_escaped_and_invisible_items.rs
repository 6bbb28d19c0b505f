//! What the gateway emits: U+2028 and U+2029 escaped in every envelope (NDJSON readers that
//! end lines there cut one in two), and no item that shows nothing (a t140llm chunk left
//! invisible once "[object Object]" is taken out; an item erased down to invisible characters
//! is removed, not updated).
//!
//! Found by review ax (session 46).

use pvp_t140::{Compat, Config, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// A t140llm packet (payload type 96) of SSRC 0x55.
fn llm(seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(&mut d, false, 96, seq, u32::from(seq) * 160, 0x55, payload);
    d
}

/// Found by review ax (session 46). A t140llm stream id is the sender's text and may hold
/// U+2028 LINE SEPARATOR or U+2029 PARAGRAPH SEPARATOR (they are no control characters, so
/// `split_named` takes them); it goes into the participant id (every envelope's `sender`, the
/// announce's `id`, each context `key`) and the `stream_id` metadata. Those were written raw:
/// valid JSON (RFC 8259), but a line reader that ends lines there (Node's `readline`, Python's
/// `str.splitlines`) cuts such an NDJSON line in two, neither of them an envelope (pvp-spec
/// 19.4: one envelope a line). Every string is now written with the two escaped, whether the
/// envelope is written by hand (join, `context.add`) or through serde_json (`context.update`,
/// `session.leave`), and it reads back as the same text.
#[test]
fn line_and_paragraph_separators_from_a_sender_are_escaped_in_every_envelope() {
    let mut gw = Gateway::new(Config {
        compat: Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    });
    let id = "ali\u{2028}ce\u{2029}";
    gw.handle_datagram(
        at(0),
        addr(6000),
        &llm(0, format!("{id}\x1eHello. ").as_bytes()),
    );
    // Two backspaces erase the space and the full stop already sent: a context.update.
    gw.handle_datagram(
        at(300),
        addr(6000),
        &llm(1, format!("{id}\x1e\x08\x08").as_bytes()),
    );
    gw.shutdown(at(600));
    let lines: Vec<String> = std::iter::from_fn(|| gw.poll_output())
        .map(|e| e.json().to_owned())
        .collect();
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("valid JSON");
            v["type"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "session.join",
            "context.add",
            "context.update",
            "session.leave"
        ]
    );
    for l in &lines {
        assert!(
            !l.contains(['\u{2028}', '\u{2029}']),
            "a raw line or paragraph separator in {l}"
        );
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        // In the participant id they are percent-encoded (review av, the same session).
        assert_eq!(
            v["sender"].as_str().unwrap(),
            "t140:00000055@127.0.0.1:6000/ali%E2%80%A8ce%E2%80%A9"
        );
    }
    // The stream id as metadata keeps them, escaped.
    assert!(lines[0].contains("ali\\u2028ce\\u2029"), "{}", lines[0]);
    let join: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(join["payload"]["participant"]["metadata"]["stream_id"], id);
}

/// Found by review ax (session 46). README "What it emits": a chunk of nothing but invisible
/// characters (Default_Ignorable_Code_Point) is never sent. With `--compat t140llm` the
/// "[object Object]" t140llm writes for a stringified object is taken out after the chunker
/// judged the chunk, and only white space was trimmed from what was left: a chunk of that
/// and a zero-width space joined a participant to add an item showing nothing.
#[test]
fn a_t140llm_chunk_left_invisible_by_the_object_taken_out_is_not_sent() {
    let mut gw = Gateway::new(Config {
        compat: Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    });
    gw.handle_datagram(
        at(0),
        addr(6000),
        &llm(0, "[object Object]\u{200b}\u{2060}".as_bytes()),
    );
    gw.shutdown(at(5_000));
    let out = drain(&mut gw);
    let kinds: Vec<&str> = out.iter().map(|e| e.kind.as_str()).collect();
    assert!(kinds.is_empty(), "{out:?}");
    assert_eq!(gw.stats().t140llm_objects, 1);
}

/// Found by review ax (session 46). README "Text decoding": a backspace that reaches text
/// already sent gives the item a `context.update`, "or a `context.remove` when nothing is
/// left". Only white space counted as nothing: erasing the letters after a word joiner (an
/// invisible character the chunk may begin with) updated the item to the word joiner alone,
/// an item showing nothing, where the chunker never sends such a chunk.
#[test]
fn erasing_all_but_invisible_characters_of_the_last_item_removes_it() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &t140(1, 7, "\u{2060}Hi"));
    // The idle flush sends "\u{2060}Hi"; then two backspaces erase "Hi".
    gw.handle_timeout(at(3_000));
    gw.handle_datagram(at(3_100), addr(5000), &t140(2, 7, "\u{8}\u{8}"));
    gw.shutdown(at(3_200));
    let out = drain(&mut gw);
    let kinds: Vec<&str> = out.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "session.join",
            "context.add",
            "context.remove",
            "session.leave"
        ],
        "{out:?}"
    );
    assert_eq!(out[1].payload["content"], "\u{2060}Hi");
    assert_eq!(out[2].payload["key"], out[1].payload["key"]);
    assert!(shown(&out).is_empty());
}
