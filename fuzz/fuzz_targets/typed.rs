//! What `pvp-t140 send` reads, as T.140 sends it (`pvp_t140::typed`): never panics, input split
//! across reads comes out as whole (same text, same count left out), and what comes out holds
//! no control T.140 has not: BS, BEL and U+2028 alone, ESC only to begin SGR (`ESC [` digits
//! and `;`, then `m`) or INT (`ESC a`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvp_t140::typed::Typed;

fn typed(text: &str, cuts: &[u8]) -> (String, u64) {
    let mut t = Typed::default();
    let mut out = String::new();
    let mut rest = text;
    for &c in cuts {
        let mut at = usize::from(c).min(rest.len());
        while !rest.is_char_boundary(at) {
            at -= 1;
        }
        let (a, b) = rest.split_at(at);
        out.push_str(&t.t140(a));
        rest = b;
    }
    out.push_str(&t.t140(rest));
    t.finish();
    (out, t.dropped())
}

/// Whether `out` holds only T.140's controls (see the module's doc).
fn t140_only(out: &str) -> Result<(), String> {
    let mut rest = out;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        match c {
            '\u{8}' | '\u{7}' | '\u{2028}' => {}
            '\u{1b}' => {
                if let Some(after) = rest.strip_prefix('a') {
                    rest = after;
                    continue;
                }
                let Some(csi) = rest.strip_prefix('[') else {
                    return Err(format!("ESC not SGR or INT before {rest:?}"));
                };
                let params = csi.bytes().take_while(|b| b.is_ascii_digit() || *b == b';');
                let n = params.count();
                let Some(after) = csi[n..].strip_prefix('m') else {
                    return Err(format!("CSI not SGR: {csi:?}"));
                };
                rest = after;
            }
            c if c.is_control() || c == '\u{2029}' => {
                return Err(format!("control {c:?} sent"));
            }
            _ => {}
        }
    }
    Ok(())
}

fuzz_target!(|input: &[u8]| {
    let Some((&head, rest)) = input.split_first() else {
        return;
    };
    let ncuts = usize::from(head & 7).min(rest.len());
    let (cuts, data) = rest.split_at(ncuts);
    let text = String::from_utf8_lossy(data);
    let whole = typed(&text, &[]);
    assert_eq!(whole, typed(&text, cuts), "split at {cuts:?}");
    if let Err(e) = t140_only(&whole.0) {
        panic!("{e}: {:?} from {text:?}", whole.0);
    }
});
