//! ITU-T T.140 presentation-level decoding: UTF-8 text with a few control functions.
//!
//! The decoder is a byte-at-a-time state machine so that a character (or an escape sequence)
//! split across RTP packets is reassembled (RFC 4103 section 3: packets carry T140blocks that
//! need not end on a character boundary in practice). It never allocates; decoded text goes to a
//! [`TextSink`].

/// Where decoded text goes (the chunker in the gateway, a `String` in tests).
pub trait TextSink {
    /// A printable character (never a control, never the BOM).
    fn push_char(&mut self, c: char);
    /// A new line (T.140: CR LF, LF, CR or U+2028 LINE SEPARATOR).
    fn new_line(&mut self);
    /// Backspace (T.140 U+0008): erase the last character or new line. Returns false when there
    /// was nothing left to erase in the sink.
    fn backspace(&mut self) -> bool;
    /// A run of printable ASCII bytes (0x20..=0x7E only): most of any transcript, so sinks may
    /// take it faster than a character at a time.
    fn push_ascii(&mut self, s: &[u8]) {
        for &b in s {
            self.push_char(char::from(b));
        }
    }
}

impl TextSink for String {
    fn push_char(&mut self, c: char) {
        self.push(c);
    }
    fn new_line(&mut self) {
        self.push('\n');
    }
    fn backspace(&mut self) -> bool {
        self.pop().is_some()
    }
}

/// A sink that notes whether anything reached it ([`Decoder::feed_said`]'s answer).
struct Told<'s, S: ?Sized> {
    sink: &'s mut S,
    text: bool,
}

impl<S: TextSink + ?Sized> TextSink for Told<'_, S> {
    fn push_char(&mut self, c: char) {
        self.text = true;
        self.sink.push_char(c);
    }
    fn new_line(&mut self) {
        self.text = true;
        self.sink.new_line();
    }
    fn backspace(&mut self) -> bool {
        self.text = true;
        self.sink.backspace()
    }
    fn push_ascii(&mut self, s: &[u8]) {
        self.text = true;
        self.sink.push_ascii(s);
    }
}

/// Anomalies and controls the decoder saw, for metrics. Plain counters, never reset. A decoder
/// counts into its caller's (the gateway's totals), not into itself: a decoder sits in its
/// stream's hot cache line, and 20 bytes of counters that are nearly always zero would push the
/// speaker's hot part past it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DecodeStats {
    /// Invalid UTF-8 sequences, each replaced by U+FFFD.
    pub invalid_utf8: u64,
    /// Byte-order marks dropped (T.140 allows U+FEFF anywhere as a no-op).
    pub bom: u64,
    /// Backspaces that found nothing to erase in the sink (the text was already flushed).
    pub backspace_unmatched: u64,
    /// C0/C1 controls dropped (BEL, HT, DEL, ...).
    pub controls_dropped: u64,
    /// Escape sequences (ESC, intermediates, final; CSI ... final; SOS/DCS/OSC/PM/APC ... ST
    /// or BEL) skipped.
    pub sequences_skipped: u64,
}

impl DecodeStats {
    /// Adds another set of counters (another worker's totals).
    pub fn add(&mut self, o: &DecodeStats) {
        self.invalid_utf8 += o.invalid_utf8;
        self.bom += o.bom;
        self.backspace_unmatched += o.backspace_unmatched;
        self.controls_dropped += o.controls_dropped;
        self.sequences_skipped += o.sequences_skipped;
    }
}

/// One more of a counted anomaly.
#[inline]
fn count(c: &mut u64) {
    *c += 1;
}

/// SOS/DCS/OSC/PM/APC strings are bounded so a missing ST cannot swallow the stream.
const MAX_STRING: u16 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctl {
    Normal,
    /// Just saw CR: a following LF belongs to the same new line.
    AfterCr,
    /// Just saw ESC.
    Esc,
    /// After ESC and intermediate bytes (02/00..02/15), awaiting the final byte (ECMA-35
    /// 13.2: `ESC ( B`, `ESC # 8`, `ESC SP F`).
    EscInter,
    /// Inside a control sequence (ESC [ or U+009B). Unbounded in length (a 24-bit colour SGR
    /// for foreground and background has 33 parameter bytes) yet in no state but this: every
    /// byte is swallowed until the final byte, and a byte no sequence can hold ends it.
    Csi,
    /// Inside a command string (DCS, OSC, PM, APC) until ST, with its length so far.
    Str(u16),
    /// Inside a command string, just saw ESC: `ESC \` (ST) ends it, any other ESC ends it
    /// and begins an escape sequence.
    StrEsc,
    /// Inside an SOS string, which may hold any character but SOS and ST (ECMA-48 8.3.128), an
    /// ESC too, until ST, with its length so far.
    Sos(u16),
    /// Inside an SOS string, just saw ESC (possible `ESC \` = ST), with its length before the
    /// ESC.
    SosEsc(u16),
}

/// [`Decoder::acc`] after a loss mark, while continuation bytes opening the next block are
/// skipped: above any code point, so no character's accumulation is ever equal to it.
const AFTER_LOSS: u32 = u32::MAX;

/// Per-stream T.140 decoder state: 12 bytes, where the speaker's hot line has room.
#[derive(Debug, Clone)]
pub struct Decoder {
    /// Code point accumulated so far and continuation bytes still needed.
    acc: u32,
    need: u8,
    /// Valid range of the next continuation byte (narrowed after E0, ED, F0, F4 leads).
    lo: u8,
    hi: u8,
    ctl: Ctl,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            acc: 0,
            need: 0,
            lo: 0x80,
            hi: 0xbf,
            ctl: Ctl::Normal,
        }
    }
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// [`Decoder::feed`], answering whether text came of the block (a character, a new line, a
    /// backspace): a block of nothing but a BOM, which some senders send alone as a
    /// keep-alive, or of skipped controls is silence, from which the idle flush still counts.
    /// A block opening with printable ASCII is text without asking the sink (but for the rest
    /// of a control sequence an earlier block began, which then counts as text, as every
    /// block did before): the packet path's case stays as cheap as it was.
    #[inline]
    pub fn feed_said<S: TextSink + ?Sized>(
        &mut self,
        bytes: &[u8],
        sink: &mut S,
        counts: &mut DecodeStats,
    ) -> bool {
        match bytes.first() {
            Some(b) if (0x20..0x7f).contains(b) => {
                self.feed(bytes, sink, counts);
                true
            }
            Some(_) => self.feed_told(bytes, sink, counts),
            None => false,
        }
    }

    #[inline(never)]
    fn feed_told<S: TextSink + ?Sized>(
        &mut self,
        bytes: &[u8],
        sink: &mut S,
        counts: &mut DecodeStats,
    ) -> bool {
        let told = &mut Told { sink, text: false };
        self.feed(bytes, told, counts);
        told.text
    }

    /// Decodes one T140block (an RTP payload or a RED block), counting anomalies into `counts`.
    pub fn feed<S: TextSink + ?Sized>(
        &mut self,
        bytes: &[u8],
        sink: &mut S,
        counts: &mut DecodeStats,
    ) {
        let mut rest = bytes;
        while let Some((&b, tail)) = rest.split_first() {
            // Fast path: between characters and outside any control sequence, printable ASCII
            // is text as it is (T.140 section 5: no control among U+0020..U+007E).
            if self.need == 0 && self.ctl == Ctl::Normal {
                let run = rest
                    .iter()
                    .position(|b| !(0x20..0x7f).contains(b))
                    .unwrap_or(rest.len());
                if run > 0 {
                    let (ascii, tail) = rest.split_at(run);
                    sink.push_ascii(ascii);
                    rest = tail;
                    continue;
                }
            }
            self.byte(b, sink, counts);
            rest = tail;
        }
    }

    /// Ends the stream: an incomplete character left over becomes U+FFFD, and an unfinished
    /// control function (ESC, a control sequence or string, a CR awaiting its LF) ends with it.
    /// A mixer's source keeps its speaker, and this decoder, across its BYE (RFC 3550 6.6): its
    /// next session's text must not be read as the old one's escape sequence.
    pub fn finish<S: TextSink + ?Sized>(&mut self, sink: &mut S, counts: &mut DecodeStats) {
        if self.need > 0 {
            self.give_up_partial(sink, counts);
        }
        self.end_control(counts);
    }

    /// Ends an unfinished control function: an escape sequence or control string cut short (by
    /// a loss, the stream's end or a sender's restart) is skipped all the same, and counted as
    /// one.
    pub fn end_control(&mut self, counts: &mut DecodeStats) {
        if self.in_control() {
            count(&mut counts.sequences_skipped);
        }
        self.ctl = Ctl::Normal;
    }

    /// The character begun is not completed: one U+FFFD for it (its maximal subpart), unless
    /// it is the rest of one a loss cut, which the loss's mark stands for already.
    fn give_up_partial<S: TextSink + ?Sized>(&mut self, sink: &mut S, counts: &mut DecodeStats) {
        self.need = 0;
        self.lo = 0x80;
        self.hi = 0xbf;
        if self.acc != AFTER_LOSS {
            self.invalid(sink, counts);
        }
    }

    /// Whether part of a character waits for the rest of its bytes (a block ended inside it):
    /// text the next block completes.
    pub fn holds_partial(&self) -> bool {
        self.need > 0 && self.acc != AFTER_LOSS
    }

    /// Whether a control function is begun and not ended (ESC, a control sequence or string):
    /// its rest is in the next block, and a fresh decoder would take it for text.
    pub fn in_control(&self) -> bool {
        !matches!(self.ctl, Ctl::Normal | Ctl::AfterCr)
    }

    /// Marks text lost beyond recovery (RFC 4103 section 5.3): resets any partial character or
    /// escape sequence, since what followed it is gone, and writes U+FFFD.
    ///
    /// The lost text may have ended inside a character: up to three continuation bytes that
    /// open the next block are its rest, lost with it (the U+FFFD stands for them), not a
    /// character of their own.
    pub fn mark_loss<S: TextSink + ?Sized>(&mut self, sink: &mut S, counts: &mut DecodeStats) {
        self.lead(AFTER_LOSS, 3, 0x80, 0xbf);
        self.end_control(counts);
        sink.push_char(char::REPLACEMENT_CHARACTER);
    }

    fn invalid<S: TextSink + ?Sized>(&mut self, sink: &mut S, counts: &mut DecodeStats) {
        count(&mut counts.invalid_utf8);
        self.char(char::REPLACEMENT_CHARACTER, sink, counts);
    }

    #[inline]
    fn byte<S: TextSink + ?Sized>(&mut self, b: u8, sink: &mut S, counts: &mut DecodeStats) {
        if self.need > 0 {
            if (self.lo..=self.hi).contains(&b) {
                if self.acc == AFTER_LOSS {
                    // The rest of a character a loss cut ([`Decoder::mark_loss`]).
                    self.need -= 1;
                    return;
                }
                self.acc = (self.acc << 6) | u32::from(b & 0x3f);
                self.need -= 1;
                self.lo = 0x80;
                self.hi = 0xbf;
                if self.need == 0 {
                    // The ranges above exclude surrogates and overlongs, so this cannot fail.
                    let c = char::from_u32(self.acc).unwrap_or(char::REPLACEMENT_CHARACTER);
                    self.char(c, sink, counts);
                }
                return;
            }
            // Maximal subpart replaced by one U+FFFD; the byte is then read afresh.
            self.give_up_partial(sink, counts);
        }
        match b {
            0x00..=0x7f => self.char(char::from(b), sink, counts),
            0xc2..=0xdf => self.lead(u32::from(b & 0x1f), 1, 0x80, 0xbf),
            0xe0 => self.lead(0, 2, 0xa0, 0xbf),
            0xed => self.lead(0x0d, 2, 0x80, 0x9f),
            0xe1..=0xef => self.lead(u32::from(b & 0x0f), 2, 0x80, 0xbf),
            0xf0 => self.lead(0, 3, 0x90, 0xbf),
            0xf1..=0xf3 => self.lead(u32::from(b & 0x07), 3, 0x80, 0xbf),
            0xf4 => self.lead(4, 3, 0x80, 0x8f),
            _ => self.invalid(sink, counts),
        }
    }

    #[inline]
    fn lead(&mut self, acc: u32, need: u8, lo: u8, hi: u8) {
        self.acc = acc;
        self.need = need;
        self.lo = lo;
        self.hi = hi;
    }

    /// One decoded character through the T.140 control interpretation.
    fn char<S: TextSink + ?Sized>(&mut self, c: char, sink: &mut S, counts: &mut DecodeStats) {
        match self.ctl {
            // The BOM is no character to a T.140 receiver (senders put it first, and some send
            // it alone as a keep-alive): one between CR and LF leaves them one new line, and one
            // inside an escape sequence (or between a string's ESC and `\`) leaves it whole.
            Ctl::AfterCr | Ctl::Esc | Ctl::EscInter | Ctl::Csi | Ctl::StrEsc | Ctl::SosEsc(_)
                if c == '\u{feff}' =>
            {
                count(&mut counts.bom);
                return;
            }
            Ctl::Esc | Ctl::EscInter => {
                let first = self.ctl == Ctl::Esc;
                self.ctl = match c {
                    '[' if first => Ctl::Csi,
                    // `ESC E` is NEL in a 7-bit code (ECMA-48 5.3: a C1 control is `ESC Fe`),
                    // a new line as U+0085 is (README "Text decoding"), not a sequence skipped.
                    'E' if first => {
                        sink.new_line();
                        Ctl::Normal
                    }
                    'X' if first => Ctl::Sos(0),
                    'P' | ']' | '^' | '_' if first => Ctl::Str(0),
                    '\u{20}'..='\u{2f}' => Ctl::EscInter,
                    '\u{30}'..='\u{7e}' => {
                        count(&mut counts.sequences_skipped);
                        Ctl::Normal
                    }
                    // No escape sequence holds a control, DEL or a non-ASCII character: the
                    // sequence is abandoned and the character read as what it is (a stray
                    // ESC before a backspace still erases).
                    _ => {
                        count(&mut counts.sequences_skipped);
                        self.ctl = Ctl::Normal;
                        return self.char(c, sink, counts);
                    }
                };
                return;
            }
            Ctl::Csi => {
                self.ctl = match c {
                    '\u{40}'..='\u{7e}' => {
                        count(&mut counts.sequences_skipped);
                        Ctl::Normal
                    }
                    // ECMA-48 5.4: parameter (0x30-0x3F) and intermediate (0x20-0x2F) bytes.
                    '\u{20}'..='\u{3f}' => Ctl::Csi,
                    // Not a valid sequence byte: abandon the sequence and read the char as text.
                    _ => {
                        count(&mut counts.sequences_skipped);
                        self.ctl = Ctl::Normal;
                        return self.char(c, sink, counts);
                    }
                };
                return;
            }
            Ctl::Sos(n) | Ctl::SosEsc(n) => {
                let was_esc = matches!(self.ctl, Ctl::SosEsc(_));
                // ST ends the string; so does BEL, which xterm-style senders end strings with.
                let end = c == '\u{9c}' || c == '\u{7}' || (was_esc && c == '\\');
                // The string ends at its character past the bound, but an ESC is counted only
                // once the character after it shows it is no ST's first half: an `ESC \` right
                // after the 256th character still ends the string whole. `n` stays in bound.
                let n = n + u16::from(was_esc);
                if !end && n > MAX_STRING {
                    // The ESC was the character past the bound: the string ends on it, and the
                    // character after it is read afresh, as after any 257th character.
                    count(&mut counts.sequences_skipped);
                    self.ctl = Ctl::Normal;
                    return self.char(c, sink, counts);
                }
                self.ctl = if end || n + u16::from(c != '\u{1b}') > MAX_STRING {
                    count(&mut counts.sequences_skipped);
                    Ctl::Normal
                } else if c == '\u{1b}' {
                    Ctl::SosEsc(n)
                } else {
                    Ctl::Sos(n + 1)
                };
                return;
            }
            Ctl::StrEsc => {
                // `ESC \` (ST) ends the string whole. An ESC before anything else ends it too,
                // and begins an escape sequence of its own: no command string may hold an ESC
                // but as ST's first half (ECMA-48 5.6; an SOS string may), and a DEC/xterm
                // parser leaves a string at an ESC. Taken for the string's content, it
                // swallowed up to 256 characters of text after an OSC whose terminator was lost
                // or stripped.
                count(&mut counts.sequences_skipped);
                if c == '\\' {
                    self.ctl = Ctl::Normal;
                    return;
                }
                self.ctl = Ctl::Esc;
                return self.char(c, sink, counts);
            }
            Ctl::Str(n) => {
                // ST ends the string; so does BEL, which no command string may hold (ECMA-48
                // 5.6) and which xterm-style senders end an OSC title with. The string ends at
                // its character past the bound; an ESC waits for the character after it
                // ([`Ctl::StrEsc`]), so an `ESC \` right after the 256th still ends it whole.
                let end = c == '\u{9c}' || c == '\u{7}';
                self.ctl = if end || n + u16::from(c != '\u{1b}') > MAX_STRING {
                    count(&mut counts.sequences_skipped);
                    Ctl::Normal
                } else if c == '\u{1b}' {
                    Ctl::StrEsc
                } else {
                    Ctl::Str(n + 1)
                };
                return;
            }
            Ctl::AfterCr if c == '\n' => {
                self.ctl = Ctl::Normal;
                return;
            }
            Ctl::AfterCr | Ctl::Normal => self.ctl = Ctl::Normal,
        }
        match c {
            '\u{feff}' => count(&mut counts.bom),
            '\r' => {
                sink.new_line();
                self.ctl = Ctl::AfterCr;
            }
            // NEL (ISO 6429 next line) as the other new lines: what a sender means is plain.
            // VT and FF too: white space and mandatory line breaks (UAX #14 class BK) that,
            // dropped as controls, joined the words on either side (review q).
            '\n' | '\u{b}' | '\u{c}' | '\u{2028}' | '\u{2029}' | '\u{85}' => sink.new_line(),
            // A tab separates words: dropped, it joined them ("a\tb" read "ab").
            '\t' => sink.push_char(' '),
            '\u{8}' => {
                if !sink.backspace() {
                    count(&mut counts.backspace_unmatched);
                }
            }
            '\u{1b}' => self.ctl = Ctl::Esc,
            '\u{9b}' => self.ctl = Ctl::Csi,
            '\u{98}' => self.ctl = Ctl::Sos(0),
            '\u{90}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => self.ctl = Ctl::Str(0),
            '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => count(&mut counts.controls_dropped),
            _ => sink.push_char(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(parts: &[&[u8]]) -> (String, DecodeStats) {
        let mut d = Decoder::new();
        let mut s = String::new();
        let mut counts = DecodeStats::default();
        for p in parts {
            d.feed(p, &mut s, &mut counts);
        }
        d.finish(&mut s, &mut counts);
        (s, counts)
    }

    /// After `finish` the decoder starts clean: no ESC, control string or CR of the ended
    /// stream reaches into what it decodes next.
    #[test]
    fn finish_ends_an_unfinished_control_function() {
        for end in [&b"\x1b"[..], b"\x1b[1;", b"\x1bX sos text", b"\r"] {
            let mut d = Decoder::new();
            let (mut s, mut counts) = (String::new(), DecodeStats::default());
            d.feed(end, &mut s, &mut counts);
            d.finish(&mut s, &mut counts);
            s.clear();
            d.feed(b"\nAgain.", &mut s, &mut counts);
            assert_eq!(s, "\nAgain.", "after {end:?}");
        }
    }

    /// An escape sequence or control string cut short by a loss or by the stream's end is
    /// skipped and counted as one (it was not counted: a sequence a loss cut vanished from the
    /// counters); a CR awaiting its LF is no sequence.
    #[test]
    fn a_sequence_cut_by_a_loss_or_the_end_is_counted() {
        for cut in [
            &b"\x1b"[..],
            b"\x1b(",
            b"\x1b[1;",
            b"\x1b]0;title",
            b"\x1b]0;t\x1b",
        ] {
            for by_loss in [false, true] {
                let mut d = Decoder::new();
                let (mut s, mut counts) = (String::new(), DecodeStats::default());
                d.feed(cut, &mut s, &mut counts);
                if by_loss {
                    d.mark_loss(&mut s, &mut counts);
                }
                d.finish(&mut s, &mut counts);
                let want = if by_loss { "\u{fffd}" } else { "" };
                assert_eq!(
                    (s.as_str(), counts.sequences_skipped),
                    (want, 1),
                    "{cut:?}, by loss: {by_loss}"
                );
            }
        }
        let mut d = Decoder::new();
        let (mut s, mut counts) = (String::new(), DecodeStats::default());
        d.feed(b"a\r", &mut s, &mut counts);
        d.mark_loss(&mut s, &mut counts);
        d.finish(&mut s, &mut counts);
        assert_eq!(counts.sequences_skipped, 0);
    }

    /// A lost packet may end inside a character: the continuation bytes opening the next
    /// block are its rest, covered by the loss's one U+FFFD (RFC 4103 5.3), not a second one
    /// as invalid UTF-8. At most three are skipped, and only at the block's start.
    #[test]
    fn a_loss_inside_a_character_is_one_mark() {
        let cases: [(&[u8], &str, u64); 5] = [
            (b"\xa9t\xc3\xa9.", "\u{fffd}t\u{e9}.", 0),
            (b"\x98\x80 ok", "\u{fffd} ok", 0),
            (b"\x80\x80\x80\x80x", "\u{fffd}\u{fffd}x", 1),
            (b"ok\xa9", "\u{fffd}ok\u{fffd}", 1),
            ("é".as_bytes(), "\u{fffd}é", 0),
        ];
        for (next, want, invalid) in cases {
            let mut d = Decoder::new();
            let (mut s, mut counts) = (String::new(), DecodeStats::default());
            d.feed(b"\xf0\x9f", &mut s, &mut counts);
            d.mark_loss(&mut s, &mut counts);
            d.feed(next, &mut s, &mut counts);
            d.finish(&mut s, &mut counts);
            assert_eq!(
                (s.as_str(), counts.invalid_utf8),
                (want, invalid),
                "{next:?}"
            );
        }
        // A loss whose next block ends inside its skip still decodes the block after.
        let mut d = Decoder::new();
        let (mut s, mut counts) = (String::new(), DecodeStats::default());
        d.mark_loss(&mut s, &mut counts);
        d.feed(b"\x80", &mut s, &mut counts);
        d.feed(b"\xe2\x82\xac", &mut s, &mut counts);
        assert_eq!(s, "\u{fffd}\u{20ac}");
    }

    #[test]
    fn a_bom_between_cr_and_lf_leaves_one_new_line() {
        let (s, st) = decode(&[b"ab\r", "\u{feff}".as_bytes(), b"\ncd"]);
        assert_eq!(s, "ab\ncd");
        assert_eq!(st.bom, 1);
        let (s, _) = decode(&["ab\r\u{feff}\u{feff}\ncd\r\u{feff}x".as_bytes()]);
        assert_eq!(s, "ab\ncd\nx");
    }

    #[test]
    fn plain_text_and_bom() {
        let (s, st) = decode(&[b"\xef\xbb\xbfHello", b" world\xef\xbb\xbf"]);
        assert_eq!(s, "Hello world");
        assert_eq!(st.bom, 2);
    }

    #[test]
    fn characters_split_across_packets_are_reassembled() {
        let text = "café — naïve 日本語 😀";
        let bytes = text.as_bytes();
        // Split at every byte boundary, one packet per byte.
        let parts: Vec<&[u8]> = bytes.chunks(1).collect();
        let (s, st) = decode(&parts);
        assert_eq!(s, text);
        assert_eq!(st.invalid_utf8, 0);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        // Lone continuation, bad lead, overlong, surrogate, truncated 4-byte sequence.
        let (s, st) = decode(&[b"a\x80b\xffc\xc0\xafd\xed\xa0\x80e\xf0\x9f\x98"]);
        assert_eq!(
            s,
            "a\u{fffd}b\u{fffd}c\u{fffd}\u{fffd}d\u{fffd}\u{fffd}\u{fffd}e\u{fffd}"
        );
        assert_eq!(st.invalid_utf8, 8);
        // Interrupted sequence: the interrupting byte is read afresh.
        let (s, _) = decode(&[b"\xe6\x97x"]);
        assert_eq!(s, "\u{fffd}x");
    }

    #[test]
    fn matches_std_lossy_decoding() {
        let samples: &[&[u8]] = &[
            b"\xf4\x90\x80\x80",
            b"\xe0\x80\x80",
            b"\xf0\x80\x80\x80x",
            b"\xc2",
            b"\xe2\x82",
            b"ok\xe2\x82\xac!",
        ];
        for s in samples {
            let (got, _) = decode(&[s]);
            assert_eq!(got, String::from_utf8_lossy(s), "{s:?}");
        }
    }

    #[test]
    fn new_lines_in_every_form_and_backspace() {
        let (s, _) = decode(&[b"a\r\nb\rc\nd\xe2\x80\xa8e\xc2\x85f"]);
        assert_eq!(s, "a\nb\nc\nd\ne\nf");
        // A tab keeps the words it separates apart.
        let (s, st) = decode(&[b"one\ttwo"]);
        assert_eq!((s.as_str(), st.controls_dropped), ("one two", 0));
        // CR LF split across packets is still one new line, erased by one backspace.
        let (s, _) = decode(&[b"x\r", b"\n\x08y"]);
        assert_eq!(s, "xy");
        let (s, st) = decode(&[b"Helo\x08\x08lo\x08\x08\x08\x08\x08\x08!"]);
        assert_eq!(s, "!");
        assert_eq!(st.backspace_unmatched, 2);
    }

    /// `ESC E`, NEL in a 7-bit code (ECMA-48 5.3: every C1 control is `ESC Fe`), is one new
    /// line as U+0085 is (README "Text decoding"), also split between packets, and no skipped
    /// sequence. A review found it skipped as an unknown escape sequence, joining the words
    /// on either side ("onetwo") (review, session 35).
    #[test]
    fn esc_e_the_seven_bit_nel_is_a_new_line_as_u0085_is() {
        let (c1, _) = decode(&["one\u{85}two".as_bytes()]);
        assert_eq!(c1, "one\ntwo", "the reference: NEL as the C1 character");
        let (seven_bit, counts) = decode(&[b"one\x1bEtwo"]);
        assert_eq!(
            (seven_bit.as_str(), counts.sequences_skipped),
            ("one\ntwo", 0),
            "ESC E is NEL in a 7-bit code"
        );
        assert_eq!(decode(&[b"one\x1b", b"Etwo"]).0, "one\ntwo");
        // Only right after ESC: after an intermediate byte, `E` is a final byte.
        assert_eq!(decode(&[b"one\x1b Etwo"]).0, "onetwo");
    }

    #[test]
    fn controls_and_sequences_leave_no_debris() {
        // BEL, SGR via ESC [ and via C1 CSI, a bare ESC sequence, an SOS string ended by ST.
        let (s, st) = decode(&[
            b"a\x07b\x1b[1;31mc\xc2\x9b0md\x1bce\x1bXhidden\x1b\\f\xc2\x98x\xc2\x9cg\tH\x7f",
        ]);
        assert_eq!(s, "abcdefg H");
        assert_eq!(st.controls_dropped, 2);
        assert_eq!(st.sequences_skipped, 5);
        // A sequence split across packets.
        let (s, _) = decode(&[b"a\x1b", b"[3", b"1m", b"b"]);
        assert_eq!(s, "ab");
    }

    #[test]
    fn unterminated_strings_are_bounded() {
        let mut input = b"\x1bX".to_vec();
        input.extend(std::iter::repeat_n(b'z', 300));
        input.extend_from_slice(b"visible");
        let (s, _) = decode(&[&input]);
        assert!(s.ends_with("visible"), "{s}");
        assert!(s.len() < 60);
    }

    /// A control string of exactly 256 characters (the bound, README "Text decoding") ended
    /// by the 7-bit ST `ESC \` is skipped whole: the ESC at the bound may be the ST's first
    /// half, so the `\` after it is no text. A review found the string ended on the ESC and
    /// its `\` reached the transcript (review, session 33).
    #[test]
    fn an_osc_string_of_256_characters_ended_by_esc_backslash_leaves_no_debris() {
        let mut osc = b"\x1b]0;".to_vec();
        osc.extend(std::iter::repeat_n(b'z', 254));
        osc.extend_from_slice(b"\x1b\\Hello.");
        let (text, counts) = decode(&[&osc]);
        assert_eq!(text, "Hello.");
        assert_eq!(counts.sequences_skipped, 1);
    }

    /// An ESC right after a control string's 256th character that proves no ST's first half
    /// ends the string, as any ESC in it does, and begins an escape sequence of its own
    /// (review q): `ESC H` is one (HTS), skipped, and a character no sequence holds after it
    /// (`é`) is read afresh, so nothing past the string is eaten with it. "Hi" after an
    /// `ESC ESC [1m` is text, the second ESC a sequence of its own. A review found the
    /// character after the ESC eaten with the string (review, session 33).
    #[test]
    fn an_esc_right_after_a_full_control_string_ends_it_without_eating_the_next_character() {
        // `ESC ]` then "0;" and 254 characters: 256 in the string.
        let mut osc = b"\x1b]0;".to_vec();
        osc.extend(std::iter::repeat_n(b'z', 254));
        // The 257th character a plain one: the string ends on it, and "Hi" is text.
        let mut plain = osc.clone();
        plain.extend_from_slice(b"zHi");
        assert_eq!(decode(&[&plain]).0, "Hi", "the reference: a 257th z");
        // The 257th character an ESC that proves not to be ST's first half: `ESC H` (HTS).
        let mut esc = osc.clone();
        esc.extend_from_slice(b"\x1bHi");
        let (text, counts) = decode(&[&esc]);
        assert_eq!((text.as_str(), counts.sequences_skipped), ("i", 2));
        let mut esc = osc.clone();
        esc.extend_from_slice("\x1b\u{e9}t".as_bytes());
        assert_eq!(
            decode(&[&esc]).0,
            "\u{e9}t",
            "the character after the ESC is read"
        );
        // The 257th an ESC followed by another: that one starts a sequence of its own.
        let mut esc_esc = osc;
        esc_esc.extend_from_slice(b"\x1b\x1b[1mHi");
        let (text, counts) = decode(&[&esc_esc]);
        assert_eq!((text.as_str(), counts.sequences_skipped), ("Hi", 3));
    }

    /// Within the bound too, an ESC that is no ST's first half ends the string and begins a
    /// sequence (review q): an OSC title whose BEL was lost, then an SGR, leaves the text after
    /// them whole, also with the ESC at a packet's end.
    #[test]
    fn an_esc_inside_a_control_string_ends_it_and_begins_a_sequence() {
        let (s, st) = decode(&[b"\x1b]0;title\x1b[32mHello"]);
        assert_eq!((s.as_str(), st.sequences_skipped), ("Hello", 2));
        assert_eq!(decode(&[b"\x1bPdcs\x1b", b"[1mHi"]).0, "Hi");
        // An SOS string may hold an ESC (ECMA-48 8.3.128): only ST ends it.
        assert_eq!(decode(&[b"\x1bXa\x1b[1mb\x1b\\Hi"]).0, "Hi");
        assert_eq!(decode(&["\u{98}a\x1b[1mb\u{9c}Hi".as_bytes()]).0, "Hi");
        assert_eq!(decode(&[b"\x1b]0;t\x1b", b"\\Hi"]).0, "Hi");
    }

    /// A 24-bit colour SGR for foreground and background (ITU T.416 parameters, 33 parameter
    /// bytes) is a well-formed control sequence (ECMA-48 5.4, which bounds no length): it is
    /// skipped whole, and none of it, such as its last "5m", is read as text.
    #[test]
    fn a_control_sequence_of_any_length_leaves_no_debris() {
        let (s, st) = decode(&[b"a\x1b[38;2;255;255;255;48;2;255;255;255mb"]);
        assert_eq!(s, "ab");
        assert_eq!(st.sequences_skipped, 1);
        // Split across packets, and longer still: the same, in no more state.
        let mut long = b"x\xc2\x9b".to_vec();
        long.extend(std::iter::repeat_n(b'1', 1000));
        let (s, _) = decode(&[
            b"a\x1b[38;2;",
            b"255;255;255;48;2;255;25",
            b"5;255mb",
            &long,
            b"Hy",
        ]);
        assert_eq!(s, "abxy");
        // A byte no sequence holds still ends one early, and is read afresh.
        let (s, _) = decode(&[b"a\x1b[38;2\nb"]);
        assert_eq!(s, "a\nb");
    }

    /// An escape sequence with intermediate bytes (ECMA-35 13.2 / ECMA-48 5.3: `ESC`, any
    /// number of intermediates 02/00..02/15, then one final byte 03/00..07/14), such as
    /// `ESC ( B` (designate ASCII as G0, common in text that passed through a terminal),
    /// `ESC # 8` or `ESC SP F` (S7C1T), is one sequence. The decoder takes `ESC` plus one
    /// character as the whole sequence, so the final byte leaks into the transcript as text
    /// ("aBb"), against the README's promise that escape sequences are skipped.
    /// A BOM inside an escape sequence is dropped as anywhere else (README "Text decoding"),
    /// leaving the sequence whole: the SGR is skipped, not abandoned with its rest read as
    /// text ("a[1mb"). A review found it abandoned the sequence (review, session 33).
    #[test]
    fn a_bom_inside_an_escape_sequence_does_not_leak_the_sequence() {
        assert_eq!(decode(&["a\x1b\u{feff}[1mb".as_bytes()]).0, "ab");
        assert_eq!(decode(&["a\x1b[1\u{feff};31mb".as_bytes()]).0, "ab");
        let (s, st) = decode(&["a\x1b(\u{feff}Bb\x1bX..\x1b\u{feff}\\c".as_bytes()]);
        assert_eq!((s.as_str(), st.bom, st.sequences_skipped), ("abc", 2, 2));
    }

    #[test]
    fn an_escape_sequence_with_intermediate_bytes_leaves_no_debris() {
        assert_eq!(decode(&[b"a\x1b(Bb"]).0, "ab");
        assert_eq!(decode(&[b"a\x1b#8b"]).0, "ab");
        assert_eq!(decode(&[b"a\x1b F", b"b"]).0, "ab");
    }

    /// An OSC string ended by BEL (`ESC ] 0 ; title BEL`, how xterm-style senders set a
    /// title): ECMA-48 5.6 allows only 00/08..00/13 and 02/00..07/14 in a command string, so
    /// BEL cannot be part of it; it ends the string (as xterm reads it) or at least abandons it.
    /// The decoder keeps swallowing every character after it as part of the string, up to 256
    /// of them: the speaker's next sentence vanishes from the transcript.
    #[test]
    fn an_osc_string_ended_by_bel_does_not_swallow_the_text_after_it() {
        assert_eq!(
            decode(&[b"\x1b]0;my title\x07Hello world, how are you?"]).0,
            "Hello world, how are you?"
        );
    }

    /// Only 02/00..07/14 can follow ESC in an escape sequence (ECMA-35 13.2, ECMA-48 5.3); a
    /// C0 control there is executed, not swallowed (the DEC/ECMA-48 parser's "execute" in its
    /// escape state), and a character outside the range is no sequence at all. The decoder
    /// takes whatever comes after ESC as the sequence's final byte: a backspace after a stray
    /// ESC no longer erases ("ab" stays, the speaker erased the "b"), and a letter such as
    /// "é" vanishes from the transcript. Its own CSI state reads such a byte afresh
    /// ("A byte no sequence holds still ends one early"): the ESC state does not.
    #[test]
    fn a_byte_no_escape_sequence_holds_is_not_swallowed_after_esc() {
        assert_eq!(decode(&["ab\x1b\x08".as_bytes()]).0, "a");
        assert_eq!(
            decode(&["a\x1b\u{e9}t\u{e9}".as_bytes()]).0,
            "a\u{e9}t\u{e9}"
        );
    }
}
