//! What `pvp-t140 send` reads (a terminal, a pipe, a file), as T.140 text: strict in what it
//! emits. T.140 (section 6) names the controls a sender may use: BACKSPACE (U+0008) to erase,
//! LINE SEPARATOR (U+2028) for a new line, BELL (U+0007), SGR (`ESC [ Ps m`) for graphic
//! rendition and INT (`ESC a`). Anything else a terminal or a coloured log gives (cursor
//! moves `ESC [ K`, other escapes, C0 and C1 controls) is no text a receiver shows, and
//! receivers differ on it: it is left out here and counted, where before it went on the wire
//! as it came. Sans-IO: text in, text out; a sequence split across reads is held for the next.

/// The longest escape sequence kept whole; a longer one is left out and what follows read
/// afresh (as the gateway's own decoder bounds them, [`crate::t140`]).
const MAX_SEQUENCE: usize = 64;

/// The input's state across reads. See the module's doc.
#[derive(Debug, Default)]
pub struct Typed {
    /// The text before ended with a CR: an LF that begins the next is the rest of its CR LF.
    after_cr: bool,
    /// An escape sequence begun and not yet ended (`ESC`, `ESC [` and its parameters, or `ESC`
    /// and intermediate bytes).
    sequence: String,
    /// Controls and escape sequences left out.
    dropped: u64,
}

impl Typed {
    /// `text` as T.140 sends it. New lines (LF, CR LF, a lone CR, NEL: Unicode TR13's new-line
    /// function; VT, FF and U+2029, as the gateway reads them) become U+2028: T.140's own, and
    /// receivers differ on a bare CR. A CR that
    /// ends `text` is a new line at once (a terminal in raw mode sends one for Enter, and the
    /// user may type nothing more for a while); an LF that begins the next text is the rest of
    /// its CR LF. DEL, a raw-mode terminal's Backspace key (`stty erase ^?`), becomes BS,
    /// T.140's erase (a receiver drops DEL as a control). A tab is a space (T.140 has none).
    pub fn t140(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if !self.sequence.is_empty() && self.in_sequence(c, &mut out) {
                continue;
            }
            let after_cr = std::mem::take(&mut self.after_cr);
            match c {
                '\r' => {
                    out.push('\u{2028}');
                    self.after_cr = true;
                }
                '\n' if after_cr => {}
                '\n' | '\u{b}' | '\u{c}' | '\u{85}' | '\u{2029}' => out.push('\u{2028}'),
                '\u{7f}' | '\u{8}' => out.push('\u{8}'),
                '\t' => out.push(' '),
                '\u{7}' => out.push(c),
                '\u{1b}' => self.sequence.push(c),
                // C1 CSI: the 8-bit form of `ESC [`.
                '\u{9b}' => self.sequence.push_str("\u{1b}["),
                c if c.is_control() => self.dropped += 1,
                c => out.push(c),
            }
        }
        out
    }

    /// The input ended: a sequence it left unfinished is left out.
    pub fn finish(&mut self) {
        if !self.sequence.is_empty() {
            self.sequence.clear();
            self.dropped += 1;
        }
        self.after_cr = false;
    }

    /// Controls and escape sequences left out so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// `c` within the sequence begun: true when it was taken by it (kept, or left out with
    /// it), false when it ended the sequence without being part of it (a control, a
    /// character no sequence holds), and is to be read as itself.
    fn in_sequence(&mut self, c: char, out: &mut String) -> bool {
        let csi = self.sequence.starts_with("\u{1b}[");
        let byte = u32::from(c);
        let kept = match byte {
            // Parameter bytes, within a CSI only; intermediate bytes in either.
            0x30..=0x3f if csi => {
                self.sequence.push(c);
                None
            }
            0x20..=0x2f => {
                self.sequence.push(c);
                None
            }
            // `ESC [` begins a CSI.
            0x5b if self.sequence == "\u{1b}" => {
                self.sequence.push(c);
                None
            }
            // A final byte ends it: SGR (no intermediates) and INT are T.140's.
            0x30..=0x7e => {
                let sgr = csi
                    && c == 'm'
                    && self.sequence[2..]
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b == b';');
                let int = self.sequence == "\u{1b}" && c == 'a';
                Some(sgr || int)
            }
            // Anything else cuts it short, and is read as itself.
            _ => {
                self.sequence.clear();
                self.dropped += 1;
                return false;
            }
        };
        match kept {
            Some(true) => {
                out.push_str(&self.sequence);
                out.push(c);
                self.sequence.clear();
            }
            Some(false) => {
                self.sequence.clear();
                self.dropped += 1;
            }
            None if self.sequence.len() > MAX_SEQUENCE => {
                self.sequence.clear();
                self.dropped += 1;
            }
            None => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t140(parts: &[&str]) -> (String, u64) {
        let mut t = Typed::default();
        let out: String = parts.iter().map(|p| t.t140(p)).collect();
        t.finish();
        (out, t.dropped())
    }

    #[test]
    fn new_lines_erase_and_tabs_as_t140_has_them() {
        assert_eq!(
            t140(&["a\r\nb\nc\rd\u{7f}e\tf\u{8}\u{7}"]),
            ("a\u{2028}b\u{2028}c\u{2028}d\u{8}e f\u{8}\u{7}".into(), 0)
        );
        assert_eq!(
            t140(&["a\u{85}b\u{b}c\u{c}d\u{2029}e"]),
            ("a\u{2028}b\u{2028}c\u{2028}d\u{2028}e".into(), 0)
        );
        // A CR that ends a read is a new line at once; the LF after it, its CR LF's.
        assert_eq!(t140(&["a\r", "\nb"]), ("a\u{2028}b".into(), 0));
        assert_eq!(t140(&["a\r", "\r\n"]), ("a\u{2028}\u{2028}".into(), 0));
    }

    #[test]
    fn sgr_and_int_are_kept_other_sequences_and_controls_left_out() {
        assert_eq!(
            t140(&["\u{1b}[1;31mred\u{1b}[0m \u{1b}[m\u{1b}a"]),
            ("\u{1b}[1;31mred\u{1b}[0m \u{1b}[m\u{1b}a".into(), 0)
        );
        // Cursor moves, a private mode, a charset designation, an OSC's ESC, C0 and C1.
        assert_eq!(
            t140(&["a\u{1b}[2Kb\u{1b}[?25lc\u{1b}(Bd\u{0}\u{1}\u{9f}\u{1b}Me"]),
            ("abcde".into(), 7)
        );
        // C1 CSI is SGR's 8-bit form.
        assert_eq!(t140(&["\u{9b}1mx"]), ("\u{1b}[1mx".into(), 0));
    }

    #[test]
    fn a_sequence_split_across_reads_is_kept_whole() {
        assert_eq!(t140(&["a\u{1b}", "[3", "1mb"]), ("a\u{1b}[31mb".into(), 0));
        assert_eq!(t140(&["a\u{1b}[", "2Jb"]), ("ab".into(), 1));
    }

    #[test]
    fn a_sequence_cut_short_leaves_what_cut_it_as_itself() {
        // A new line, a letter beyond ASCII, another ESC.
        assert_eq!(t140(&["\u{1b}[1\nx"]), ("\u{2028}x".into(), 1));
        assert_eq!(t140(&["\u{1b}[é"]), ("é".into(), 1));
        assert_eq!(t140(&["\u{1b}\u{1b}[1m!"]), ("\u{1b}[1m!".into(), 1));
        // Unfinished at the end of input; one too long.
        assert_eq!(t140(&["ok\u{1b}[12"]), ("ok".into(), 1));
        let long = format!("\u{1b}[{}mz", "1;".repeat(40));
        let rest = &long[2 + MAX_SEQUENCE - 1..];
        assert_eq!(t140(&[&long]), (rest.into(), 1));
    }
}
