//! Helpers for the core-driven tests of mixer streams (RFC 9071: one SSRC, each source a
//! CSRC) and of BYEs: packets, RTCP, and views of the envelopes. Included by path beside
//! `common/core.rs`, which an including test names `core_helpers`.
#![allow(dead_code)]

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Gateway, red};

use super::core_helpers::at;

/// The mixer's SSRC in these tests.
pub const MIXER: u32 = 9;

/// An RTP packet from `ssrc` with one CSRC, T.140 payload type 98.
pub fn with_csrc_m(
    marker: bool,
    seq: u16,
    ts: u32,
    ssrc: u32,
    csrc: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut d = vec![0x81, 98 | if marker { 0x80 } else { 0 }, 0, 0];
    d[2..4].copy_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&ts.to_be_bytes());
    d.extend_from_slice(&ssrc.to_be_bytes());
    d.extend_from_slice(&csrc.to_be_bytes());
    d.extend_from_slice(payload);
    d
}

/// [`with_csrc_m`], marked when it is the sequence's first (1).
pub fn with_csrc(seq: u16, ts: u32, ssrc: u32, csrc: u32, payload: &[u8]) -> Vec<u8> {
    with_csrc_m(seq == 1, seq, ts, ssrc, csrc, payload)
}

/// The mixer's packet with one CSRC and a RED payload (PT 100, RFC 2198), `gens` oldest
/// first as (timestamp offset, text), the marker bit given.
pub fn red_csrc_m(
    marker: bool,
    seq: u16,
    ts: u32,
    csrc: u32,
    gens: &[(u16, &[u8])],
    primary: &[u8],
) -> Vec<u8> {
    let mut d = vec![0x81, 100 | if marker { 0x80 } else { 0 }, 0, 0];
    d[2..4].copy_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&ts.to_be_bytes());
    d.extend_from_slice(&MIXER.to_be_bytes());
    d.extend_from_slice(&csrc.to_be_bytes());
    red::write_payload(&mut d, 98, gens, primary);
    d
}

/// [`red_csrc_m`], marked when it is the sequence's first (1).
pub fn red_csrc(seq: u16, ts: u32, csrc: u32, gens: &[(u16, &[u8])], primary: &[u8]) -> Vec<u8> {
    red_csrc_m(seq == 1, seq, ts, csrc, gens, primary)
}

/// A mixer's (`ssrc`) compound RTCP packet: an empty RR, then a BYE for source `csrc`, as a
/// mixer forwards its source's BYE (RFC 3550 6.6, 7.3).
pub fn mixer_bye_from(ssrc: u32, csrc: u32) -> Vec<u8> {
    let mut bye = vec![0x80, 201, 0, 1];
    bye.extend_from_slice(&ssrc.to_be_bytes());
    pvp_t140::rtcp::write_bye(&mut bye, csrc);
    bye
}

/// [`mixer_bye_from`] the mixer ([`MIXER`]).
pub fn mixer_bye(csrc: u32) -> Vec<u8> {
    mixer_bye_from(MIXER, csrc)
}

/// The mixer's own BYE, alone.
pub fn mixers_own_bye() -> Vec<u8> {
    let mut bye = Vec::new();
    pvp_t140::rtcp::write_bye(&mut bye, MIXER);
    bye
}

/// A stream's own compound RTCP: an empty RR, then its BYE (RFC 3550 6.1).
pub fn stream_bye(ssrc: u32) -> Vec<u8> {
    let mut bye = Vec::new();
    pvp_t140::rtcp::write_rr(&mut bye, ssrc);
    pvp_t140::rtcp::write_bye(&mut bye, ssrc);
    bye
}

/// An `(envelope type, content)` pair, as [`events_of`] gives them.
pub fn pair(kind: &str, content: &str) -> (String, String) {
    (kind.to_owned(), content.to_owned())
}

/// The events of the senders whose id ends with `csrc` ("": every envelope's), as (kind,
/// content).
pub fn events_of(out: &[Envelope], csrc: &str) -> Vec<(String, String)> {
    out.iter()
        .filter(|e| e.sender.ends_with(csrc))
        .map(|e| {
            let content = e.payload["content"].as_str().unwrap_or("");
            (e.kind.clone(), content.to_owned())
        })
        .collect()
}

/// A speaker's text: its `context.add` contents, joined by spaces.
pub fn text_of(out: &[Envelope], csrc: &str) -> String {
    events_of(out, csrc)
        .into_iter()
        .filter(|(k, _)| k == "context.add")
        .map(|(_, c)| c)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The mixer's own participant id (its SSRC, [`MIXER`], with no CSRC) from port 5000.
pub const OWN: &str = "t140:00000009@127.0.0.1:5000";

/// The mixer's own RED packet (SSRC [`MIXER`], no CSRC, PT 100), `gens` oldest first.
pub fn own_red(marker: bool, seq: u16, ts: u32, gens: &[(u16, &[u8])], primary: &[u8]) -> Vec<u8> {
    let mut d = vec![0x80, 100 | if marker { 0x80 } else { 0 }, 0, 0];
    d[2..4].copy_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&ts.to_be_bytes());
    d.extend_from_slice(&MIXER.to_be_bytes());
    red::write_payload(&mut d, 98, gens, primary);
    d
}

/// The `context.add` contents of the sender `id` exactly, joined by spaces.
pub fn text_of_exactly(out: &[Envelope], id: &str) -> String {
    out.iter()
        .filter(|e| e.sender == id && e.kind == "context.add")
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether any `context.add` carries a loss mark (U+FFFD).
pub fn any_mark(out: &[Envelope]) -> bool {
    out.iter().filter(|e| e.kind == "context.add").any(|e| {
        e.payload["content"]
            .as_str()
            .unwrap_or("")
            .contains('\u{fffd}')
    })
}

/// (ts, sender id's last part, kind, content) of every envelope: for failure messages.
pub type Timeline = Vec<(String, String, String, String)>;

/// The [`Timeline`] of `out`.
pub fn timeline(out: &[Envelope]) -> Timeline {
    out.iter()
        .map(|e| {
            (
                e.ts.clone(),
                e.sender.rsplit('/').next().unwrap_or("").to_owned(),
                e.kind.clone(),
                e.payload["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The envelopes' timestamps never go back.
pub fn assert_ts_monotonic(out: &[Envelope]) {
    for w in out.windows(2) {
        assert!(
            w[0].ts <= w[1].ts,
            "envelope timestamps go backwards: {:#?}",
            timeline(out)
        );
    }
}

/// Every timer of the gateway due by `until` (ms after the tests' epoch), each at its own
/// deadline.
pub fn run_timers(gw: &mut Gateway, until: u64) {
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(until)) {
        gw.handle_timeout(t);
    }
}
