//! T.140 decoding: never panics, text split across packets decodes the same as whole, what
//! comes out is printable text, plain text decodes exactly as `String::from_utf8_lossy`, and the
//! chunker's chunks are trimmed, non-empty and within the size limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvp_t140::chunker::{Chunker, Cuts, FlushCause};
use pvp_t140::t140::{DecodeStats, Decoder, TextSink};

fn decode_split(data: &[u8], cuts: &[u8]) -> String {
    let mut d = Decoder::new();
    let mut s = String::new();
    let n = &mut DecodeStats::default();
    let mut rest = data;
    for &c in cuts {
        let (a, b) = rest.split_at(usize::from(c).min(rest.len()));
        d.feed(a, &mut s, n);
        rest = b;
    }
    d.feed(rest, &mut s, n);
    d.finish(&mut s, n);
    s
}

fn is_text_char(c: char) -> bool {
    !c.is_control() && !matches!(c, '\u{feff}' | '\u{2028}' | '\u{2029}')
}

fuzz_target!(|input: &[u8]| {
    let Some((&head, rest)) = input.split_first() else {
        return;
    };
    let ncuts = usize::from(head & 7).min(rest.len());
    let (cuts, data) = rest.split_at(ncuts);

    let whole = decode_split(data, &[]);
    let split = decode_split(data, cuts);
    assert_eq!(whole, split, "split at {cuts:?}");
    assert!(
        whole.chars().all(|c| c == '\n' || is_text_char(c)),
        "control leaked: {whole:?}"
    );
    let lossy = String::from_utf8_lossy(data);
    if lossy.chars().all(is_text_char) {
        assert_eq!(whole, lossy, "plain text differs from lossy UTF-8 decoding");
    }

    // Through the chunker, with a loss mark in the middle.
    let max = usize::from(head >> 3) + 1;
    let mut ch = Chunker::new();
    let mut out = Cuts::new(max);
    let n = &mut DecodeStats::default();
    let mut d = Decoder::new();
    let (a, b) = data.split_at(data.len() / 2);
    d.feed(a, &mut ch.fed(&mut out), n);
    d.mark_loss(&mut ch.fed(&mut out), n);
    d.feed(b, &mut ch.fed(&mut out), n);
    d.finish(&mut ch.fed(&mut out), n);
    let mut chunks: Vec<_> = out.drain().collect();
    chunks.extend(ch.flush(FlushCause::End));
    for c in &chunks {
        assert!(!c.text.is_empty());
        assert_eq!(c.text, c.text.trim(), "untrimmed chunk");
        if let Err(e) = pvp_t140_fuzz::check_chunk_size(&c.text, max) {
            panic!("chunk size: {e}: {:?}", c.text);
        }
    }
    assert!(ch.is_blank() && ch.pending().is_empty());
    let _ = ch.fed(&mut out).backspace();
});
