//! The byte format the `gateway` fuzz target reads, shared with the corpus seeder
//! (`examples/make_corpus.rs`) so seeds built from real captures decode to the same events.
//!
//! ```text
//! input  := config_byte event*
//! event  := head step len_lo len_hi data[len]      (len is clamped to what is left)
//! head   := bits 0-2  source index (0-3 IPv4, 4-7 IPv6 addresses)
//!           bits 3-4  time unit of `step`: 1 us, 1 ms, 100 ms, 1 s
//!           bit  5    call handle_timeout(now) before the datagram (the shell's timer wake-up)
//!           bits 6-7  0b11: no datagram, only the time step and a handle_timeout
//! ```
//!
//! `config_byte`: bits 0-4 set `max_chunk_chars` to `8 + 16 * bits`; bits 5-6 the mixer mode
//! (1 on, 2 off, else auto); bit 7 t140llm compatibility.

/// Config byte of seeds made from standard captures: 504-char chunks, mixer auto, no compat.
pub const CONFIG_STANDARD: u8 = 0x1f;
/// The same with t140llm compatibility.
pub const CONFIG_T140LLM: u8 = 0x9f;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use pvp_t140::Config;
use pvp_t140::gateway::{Compat, MixerMode};

/// Streams the fuzzed gateway may hold.
pub const MAX_STREAMS: usize = 8;
/// Session of every envelope it emits.
pub const SESSION: &str = "fuzz";

/// The gateway a fuzz input runs: the config byte sets chunk size, mixer mode, t140llm compat.
pub fn config(b: u8) -> Config {
    Config {
        session: SESSION.into(),
        t140_pt: 98,
        red_pt: 100,
        idle_flush: Duration::from_secs(2),
        max_chunk_chars: 8 + 16 * usize::from(b & 0x1f),
        stream_timeout: Duration::from_secs(10),
        max_streams: MAX_STREAMS,
        id_seed: u128::from(b),
        reorder_wait: Duration::from_millis(1000),
        mixer: match b >> 5 & 3 {
            1 => MixerMode::On,
            2 => MixerMode::Off,
            _ => MixerMode::Auto,
        },
        compat: if b & 0x80 != 0 {
            Compat::T140llm
        } else {
            Compat::None
        },
        ..Config::default()
    }
}

/// The sources datagrams come from.
pub fn source(index: u8) -> SocketAddr {
    let i = index & 7;
    let ip = if i < 4 {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + (i & 1)))
    } else {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            0,
            0,
            0,
            0,
            0,
            1 + u16::from(i & 1),
        ))
    };
    SocketAddr::new(ip, 5000 + u16::from(i >> 1))
}

pub const UNITS_US: [u64; 4] = [1, 1_000, 100_000, 1_000_000];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    pub source: u8,
    /// Microseconds to advance before this event.
    pub step_us: u64,
    pub timeout_first: bool,
    /// `None`: a timer wake-up only.
    pub datagram: Option<&'a [u8]>,
}

/// Splits a fuzz input into its config byte and events.
pub fn decode(data: &[u8]) -> (u8, Vec<Event<'_>>) {
    let Some((&cfg, mut rest)) = data.split_first() else {
        return (0, Vec::new());
    };
    let mut events = Vec::new();
    while rest.len() >= 4 {
        let head = rest[0];
        let step = u64::from(rest[1]) * UNITS_US[usize::from(head >> 3 & 3)];
        let len = usize::from(u16::from_le_bytes([rest[2], rest[3]])).min(rest.len() - 4);
        let body = &rest[4..4 + len];
        rest = &rest[4 + len..];
        events.push(Event {
            source: head & 7,
            step_us: step,
            timeout_first: head & 0x20 != 0,
            datagram: (head & 0xc0 != 0xc0).then_some(body),
        });
    }
    (cfg, events)
}

/// Appends one datagram event; `step_us` is rounded to the coarsest unit that represents it
/// within 255 steps (longer gaps become several timer-only events).
pub fn encode_datagram(out: &mut Vec<u8>, source: u8, mut step_us: u64, datagram: &[u8]) {
    loop {
        let unit = (0..4u8)
            .find(|&u| step_us / UNITS_US[usize::from(u)] <= 255)
            .unwrap_or(3);
        let n = (step_us / UNITS_US[usize::from(unit)]).min(255);
        step_us -= n * UNITS_US[usize::from(unit)];
        let last = step_us < 1_000 || n < 255;
        let head = (source & 7) | unit << 3 | if last { 0 } else { 0xc0 };
        out.push(head);
        out.push(n as u8);
        if last {
            let len = datagram.len().min(usize::from(u16::MAX));
            out.extend_from_slice(&(len as u16).to_le_bytes());
            out.extend_from_slice(&datagram[..len]);
            return;
        }
        out.extend_from_slice(&[0, 0]);
    }
}

/// A chunk's size, as the chunker promises it: at most `max` characters, except that a size
/// cut with no white space to cut at waits for the end of the last grapheme cluster (UAX #29)
/// or of a run of ideographic sentence ends (`。。。`, `？！`: one sentence end), and a stop
/// (`.`, `!`, `?`, another script's) is held with the word before it, at most
/// [`pvp_t140::chunker::MAX_HELD`] characters past `max`. So every character past the limit
/// either continues the cluster before it, is an ideographic end after another, a closing
/// quote after a sentence end, or a stop.
pub fn check_chunk_size(text: &str, max: usize) -> Result<(), String> {
    use unicode_segmentation::UnicodeSegmentation;
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return Ok(());
    }
    let held = pvp_t140::chunker::MAX_HELD as usize;
    if chars.len() > max + held {
        return Err(format!("{} chars > {max} + {held}", chars.len()));
    }
    let ideographic_end = |c: char| matches!(c, '。' | '！' | '？');
    // Where each cluster starts, and whether the cluster before it holds an ideographic end
    // (an end with the marks that extend it, README "Chunking": `？！` is one end).
    let mut starts = vec![false; chars.len()];
    let mut after_end = vec![false; chars.len()];
    let mut at = 0;
    let mut last_held_end = false;
    for g in text.graphemes(true) {
        starts[at] = true;
        after_end[at] = last_held_end;
        last_held_end = g.chars().any(ideographic_end);
        at += g.chars().count();
    }
    // A closing quote or bracket the chunker holds with the sentence end before it (README
    // "Chunking": `"Stop."`, `？」`), past closing ones and no-break spaces already held.
    let closing = pvp_t140::chunker::holds_with_an_end;
    // `ideographic`: only an ideographic end counts (an ideographic end after closing
    // brackets is held with the end they close, `。】。`).
    let closes_an_end = |i: usize, ideographic: bool| {
        let before: String = chars[..i].iter().collect();
        // Past the clusters that begin with a closing character (with the marks that extend
        // it: `」` + U+302A) or a no-break space, to the end they close.
        let held = |g: &&str| {
            g.chars()
                .next()
                .is_some_and(|c| closing(c) || matches!(c, '\u{a0}' | '\u{2007}' | '\u{202f}'))
        };
        before
            .graphemes(true)
            .rev()
            .find(|g| !held(g))
            .is_some_and(|g| {
                g.chars().any(|c| {
                    (!ideographic && pvp_t140::chunker::is_sentence_stop(c)) || ideographic_end(c)
                })
            })
    };
    for i in max.max(1)..chars.len() {
        let joins = !starts[i]
            || (ideographic_end(chars[i]) && (after_end[i] || closes_an_end(i, true)))
            || (closing(chars[i]) && closes_an_end(i, false))
            || pvp_t140::chunker::is_sentence_stop(chars[i]);
        if !joins {
            return Err(format!(
                "{} chars > {max}, and char {i} ({:?}) starts a cluster past the limit",
                chars.len(),
                chars[i]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_chunk_size;

    #[test]
    fn chunk_size_oracle_holds_what_the_chunker_holds_and_no_more() {
        // Within the limit, or past it only by what continues the last cluster or run.
        assert!(check_chunk_size("abc", 3).is_ok());
        assert!(check_chunk_size("e\u{301}", 1).is_ok());
        assert!(check_chunk_size("。。", 1).is_ok());
        // Closing quotes held with the sentence end they close, and only those.
        assert!(check_chunk_size(".'''", 1).is_ok());
        assert!(check_chunk_size("？」", 1).is_ok());
        assert!(check_chunk_size("a''", 1).is_err());
        // A stop held with the word that filled the limit (session 47), and only a stop.
        assert!(check_chunk_size("ab.", 2).is_ok());
        assert!(check_chunk_size("ab.\"!", 2).is_ok());
        assert!(check_chunk_size("ab.x", 2).is_err());
        assert!(check_chunk_size("。】。", 1).is_ok());
        assert!(check_chunk_size("。】\u{302a}】", 1).is_ok());
        assert!(check_chunk_size("a.】。", 1).is_err());
        assert!(check_chunk_size("本当？！", 3).is_ok());
        // An end held with the mark that extends it, then another end (the chunker's held
        // size cut keeps the run whole, session 35).
        assert!(check_chunk_size("。\u{591}。\u{591}", 2).is_ok());
        assert!(check_chunk_size("。\u{591}x", 2).is_err());
        // A character past the limit starting a cluster of its own is a broken promise.
        assert!(check_chunk_size("ab", 1).is_err());
        assert!(check_chunk_size("a。", 1).is_err());
        assert!(check_chunk_size("。a", 1).is_err());
        assert!(check_chunk_size("。e\u{301}", 1).is_err());
        // And a hold is bounded.
        let long = format!("a{}", "\u{301}".repeat(40));
        assert!(check_chunk_size(&long, 1).is_err());
    }
}
