//! Buffers a stream's decoded text and cuts it into transcript chunks.
//!
//! pvp-implementation-guide STEP 4: flush on sentence boundaries, after a silence, and at a size
//! threshold. A sentence ends at `.`, `!` or `?` (or another script's terminator: `؟`, `۔`,
//! `।`, `॥`, `։`, `።`...) followed by white space (so `3.14` and `e.g.x`
//! do not split), closing quotes or brackets between them (`"Stop." Then`), or at an
//! ideographic `。`, `！`, `？` followed by anything but another of them, a closing bracket or
//! what extends its grapheme cluster (CJK text has no spaces; `？！` and `。。。` end one
//! sentence, `「本当？」` is cut after its `」`, and a combining mark or U+FE0F typed after `。`
//! is cut with it). A no-break space (U+00A0, U+2007, U+202F) joins its neighbours: it ends no
//! sentence and is no word boundary.
//! The size cut falls on the last word boundary and never inside a character. Idle and end
//! flushes are driven from outside (the stream table owns the clock).

use std::collections::VecDeque;

use crate::t140::TextSink;

/// Why a chunk was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushCause {
    Sentence,
    Idle,
    Size,
    End,
}

impl FlushCause {
    pub const ALL: [FlushCause; 4] = [Self::Sentence, Self::Idle, Self::Size, Self::End];

    pub const fn as_str(self) -> &'static str {
        match self {
            FlushCause::Sentence => "sentence",
            FlushCause::Idle => "idle",
            FlushCause::Size => "size",
            FlushCause::End => "end",
        }
    }
}

/// A finished chunk: trimmed, never empty, and never white space or invisible characters only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub text: String,
    pub cause: FlushCause,
    /// White space typed between the chunk before and this one's text: restored as the
    /// chunker's `unseen_ws` when a backspace reopens the chunk, so the next backspaces erase
    /// it before the chunk before.
    space_before: u32,
}

/// Bytes the text buffer first allocates: a typical sentence (the benchmarks' is 60 characters).
const FIRST_CAPACITY: usize = 64;

/// The chunks cut while one speaker's text is fed, and the size at which text is cut: one per
/// gateway, not one per stream. The gateway takes a speaker's chunks before it feeds the next
/// speaker, so no stream needs a list of its own, and the speaker's hot part keeps to one
/// cache line (docs/performance.md, section 18).
#[derive(Debug)]
pub struct Cuts {
    /// Oldest first: taken from the front, and a backspace reopens the newest at the back (a
    /// datagram of thousands of sentences cuts thousands, so no `Vec::remove(0)`).
    ready: VecDeque<Chunk>,
    /// Most characters (not bytes) in a chunk: the size limit counts what a reader sees.
    max_chars: u32,
    /// A backspace erases a whole grapheme cluster (UAX #29), as the t140llm sender means it
    /// (`processBackspaces` drops one cluster a U+0008), not one character (T.140).
    clusters: bool,
}

impl Cuts {
    pub fn new(max_chars: usize) -> Self {
        Cuts {
            ready: VecDeque::new(),
            max_chars: clamp(max_chars.max(1)),
            clusters: false,
        }
    }

    /// Backspaces erase grapheme clusters ([`Cuts`]'s `clusters`).
    pub fn erase_clusters(&mut self, on: bool) {
        self.clusters = on;
    }

    pub fn erases_clusters(&self) -> bool {
        self.clusters
    }

    /// The oldest chunk cut and not yet taken (no collecting, no allocation).
    pub fn pop(&mut self) -> Option<Chunk> {
        self.ready.pop_front()
    }

    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// Every chunk cut and not yet taken, oldest first.
    pub fn drain(&mut self) -> std::collections::vec_deque::Drain<'_, Chunk> {
        self.ready.drain(..)
    }
}

/// Per-stream text buffer. A chunk cut from the whole buffer takes the buffer itself (trimmed
/// in place, no copy); the caller hands the allocation of the chunk before it back
/// ([`Chunker::recycle`]) once it has no more use for it, so a speaker's text circulates
/// between two allocations and steady-state text costs no allocation even when a chunk is cut.
/// Text goes in through [`Chunker::fed`], which cuts into the gateway's [`Cuts`].
#[derive(Debug, Default)]
pub struct Chunker {
    buf: String,
    /// Characters in `buf` (not bytes).
    chars: u32,
    /// White space typed between the last cut and `buf` that is in neither (leading white
    /// space, the space that ended a sentence, the space a size cut split at, trimmed trailing
    /// white space). Kept while `buf` fills: once a backspace empties `buf`, it erases this
    /// before the chunk cut (T.140: backspace erases the last character typed).
    unseen_ws: u32,
    /// Every white space of `unseen_ws` is one a combining mark joins (a space, not a new
    /// line: UAX #29 GB4/GB9), so the newest, which the buffer follows, still is after a
    /// backspace erased one: for a cluster erase. False when not known.
    unseen_joins: bool,
    /// Backspaces that reached past everything buffered or ready: they erase text already
    /// sent, which the caller corrects on the PVP side (context.update).
    erase_sent: u32,
    /// The buffer's last byte (0 when empty), kept here so the ASCII path decides a sentence
    /// end without loading the buffer: with thousands of streams that load is a cache miss
    /// per packet, and stores to the buffer do not stall as loads do.
    tail: u8,
    /// The buffer's last grapheme cluster may be an ideographic sentence end with what extends
    /// it (UAX #29: a combining mark, U+FE0F, a ZWJ, a skin tone), which `tail` does not show:
    /// the sentence is cut before the next character that neither is an end nor extends the
    /// cluster, as a bare end is ([`Fed::cut_ideographic_end`]). A hint, checked when read.
    end_held: bool,
    /// The buffer follows a chunk cut (an idle, sentence or size cut) with nothing between
    /// but `unseen_ws`: once that is erased or was none, a cluster erase of a mark that
    /// extends that chunk's last character goes on into it ([`Fed::backspace`]). `No` before
    /// the first cut, once a backspace reached past the buffer and its `unseen_ws`, and after
    /// [`Chunker::forget_typed`].
    /// [`AfterCut::Linked`] when that chunk ends in an Indic conjunct's virama (`क्`), which the
    /// consonant after it joins into one grapheme cluster (UAX #29 GB9c): a cluster erase of
    /// that consonant goes on into the chunk, as one of a mark does. One byte, as a `bool`
    /// was: the speaker's hot part keeps to its cache lines.
    after_cut: AfterCut,
}

/// [`Chunker`]'s `after_cut`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum AfterCut {
    #[default]
    No,
    Yes,
    Linked,
}

impl AfterCut {
    /// After a chunk of `text`: [`AfterCut::Linked`] when it ends in a virama a consonant
    /// joins (UAX #29 GB9c), else [`AfterCut::Yes`].
    fn of(text: &str) -> Self {
        match text.ends_with(is_linker) && links_a_consonant(text) {
            true => AfterCut::Linked,
            false => AfterCut::Yes,
        }
    }
}

/// A chunker taking text, with where its chunks go: the decoder's [`TextSink`].
pub struct Fed<'a> {
    ch: &'a mut Chunker,
    cuts: &'a mut Cuts,
}

impl Chunker {
    /// Loads the buffer's last byte, which shares a cache line with where the next text is
    /// stored: see [`crate::Gateway::warm`].
    #[inline]
    pub fn touch(&self) -> u8 {
        self.buf.as_bytes().last().copied().unwrap_or(self.tail)
    }

    pub fn new() -> Self {
        Self::default()
    }

    /// This chunker as a sink for decoded text, cutting chunks into `cuts`.
    #[inline]
    pub fn fed<'a>(&'a mut self, cuts: &'a mut Cuts) -> Fed<'a> {
        Fed { ch: self, cuts }
    }

    /// The text buffered and not yet flushed.
    pub fn pending(&self) -> &str {
        &self.buf
    }

    /// True when nothing but white space is buffered (nothing an idle flush would send).
    pub fn is_blank(&self) -> bool {
        // Asked for every packet (timer deadline): a buffer starting with text is settled by
        // its first character (`all` stops there), without a trim over the buffer.
        all_blank(&self.buf)
    }

    /// Cuts everything buffered (idle, end). Returns `None` for white-space-only text, which is
    /// discarded.
    pub fn flush(&mut self, cause: FlushCause) -> Option<Chunk> {
        let (chunk, trailing) = self.take_chunk(cause);
        // Nothing cut: the white space still lies between the last cut and what comes next.
        let before = if chunk.is_some() { 0 } else { self.unseen_ws };
        if trailing.0 > 0 {
            self.unseen_joins = (before == 0 || self.unseen_joins) && trailing.1;
        }
        self.unseen_ws = before.saturating_add(clamp(trailing.0));
        if let Some(c) = &chunk {
            self.after_cut = AfterCut::of(&c.text);
        }
        self.tail = 0;
        self.chars = 0;
        self.end_held = false;
        chunk
    }

    /// Forgets the white space typed since the last cut and the backspaces not yet applied,
    /// once everything buffered was flushed: the speaker's participation ended, and a
    /// backspace of the next must not erase what this one typed.
    pub fn forget_typed(&mut self) {
        self.unseen_ws = 0;
        self.unseen_joins = false;
        self.erase_sent = 0;
        self.after_cut = AfterCut::No;
    }

    /// The whole buffer as a chunk, trimmed in place, and the white-space characters trimmed
    /// from its end (with whether all of them join a combining mark, `unseen_joins`): the chunk takes the allocation, and the buffer is left without one until
    /// [`Chunker::recycle`] or the next text gives it one. White space only is cleared and kept
    /// as the buffer.
    fn take_chunk(&mut self, cause: FlushCause) -> (Option<Chunk>, (usize, bool)) {
        let mut text = std::mem::take(&mut self.buf);
        let end = text.trim_end().len();
        let joins = text[end..].chars().all(|c| !c.is_control());
        let trailing = (text[end..].chars().count(), joins);
        text.truncate(end);
        // Leading white space never enters the buffer (`white_space_taken`) save as a no-break
        // space after the space a size cut split at, so this is rare.
        let lead = text.len() - text.trim_start().len();
        let lead_chars = text[..lead].chars().count();
        let space_before = self.unseen_ws.saturating_add(clamp(lead_chars));
        text.drain(..lead);
        if all_blank(&text) {
            // Invisible characters only (a zero-width space, a direction mark): as blank to a
            // reader as white space, and as white space they were typed, so a backspace erases
            // one of them before the chunk cut; so does the leading white space before them.
            let trailing = (trailing.0 + lead_chars + text.chars().count(), false);
            text.clear();
            self.buf = text;
            return (None, trailing);
        }
        (
            Some(Chunk {
                text,
                cause,
                space_before,
            }),
            trailing,
        )
    }

    /// Gives the buffer an allocation no longer needed, typically the text of the chunk sent
    /// before the one just cut (docs/performance.md, section 13: the `free` of that old text
    /// and the `malloc` of a new buffer were two of the flush path's cold lines). Kept only if
    /// the buffer has none; else it is dropped. A speaker so holds at most two allocations,
    /// each sized by chunks it sent (a chunk is at most `max_chars` characters), as it did when
    /// the buffer kept its capacity and the sent text was a copy.
    pub fn recycle(&mut self, mut spare: String) {
        if self.buf.capacity() == 0 {
            spare.clear();
            self.buf = spare;
        }
    }

    /// Backspaces past the buffer wait to be taken ([`Chunker::take_erase_sent`]).
    pub fn erase_pending(&self) -> bool {
        self.erase_sent > 0
    }

    /// Backspaces that erased text already handed out as chunks, since the last call.
    pub fn take_erase_sent(&mut self) -> usize {
        std::mem::take(&mut self.erase_sent) as usize
    }

    /// Gives an empty buffer its first allocation, a sentence. Grown from empty one push at a
    /// time, a 60-character sentence took a `malloc` and three `realloc`s, each a copy
    /// (10,000-stream drain profile: 1.3% of the gateway's samples). Later growth is the
    /// `String`'s own doubling, and the capacity is kept across cuts, so this only matters for
    /// a stream's first sentence. Only the capacity is tested: a check of the room left cost
    /// the per-character path 3-4 ns in 3 characters (criterion `parse/chunker_3chars`).
    #[inline]
    fn first_room(&mut self, bytes: usize) {
        if self.buf.capacity() == 0 {
            self.grow(bytes);
        }
    }

    #[cold]
    fn grow(&mut self, bytes: usize) {
        self.buf.reserve(bytes.max(FIRST_CAPACITY));
    }

    fn sync_tail(&mut self) {
        self.tail = self.buf.as_bytes().last().copied().unwrap_or(0);
    }

    /// Characters after the ideographic sentence end the buffer ends in, with what extends its
    /// grapheme cluster (`end_held`), or `None` when it ends in none.
    fn held_end(&self) -> Option<u32> {
        if self.buf.ends_with(is_ideographic_end) {
            Some(0)
        } else if self.end_held {
            // Closing brackets after the end (`？」`), with what extends them, are held with it.
            use unicode_segmentation::UnicodeSegmentation;
            let mut body = self.buf.as_str();
            let mut closing = 0u32;
            while let Some((at, last)) = body.grapheme_indices(true).next_back()
                && last.starts_with(is_ideographic_close)
            {
                closing = closing.saturating_add(clamp(last.chars().count()));
                body = &body[..at];
            }
            if closing > 0 && body.ends_with(is_ideographic_end) {
                Some(closing)
            } else {
                held_past_end(body).map(|n| n.saturating_add(closing))
            }
        } else {
            None
        }
    }
}

impl Fed<'_> {
    /// White space that is not kept: leading white space of a chunk carries nothing, and white
    /// space after `.`, `!` or `?` ends the sentence (the chunk is cut) unless it is a no-break
    /// space (`breaks` false), which binds `Dr.` to the name after it. Returns false for white
    /// space that goes into the buffer.
    #[inline(always)]
    fn white_space_taken(&mut self, breaks: bool, joins: bool) -> bool {
        if self.ch.buf.is_empty() {
            self.ch.unseen_joins = (self.ch.unseen_ws == 0 || self.ch.unseen_joins) && joins;
            self.ch.unseen_ws = self.ch.unseen_ws.saturating_add(1);
            return true;
        }
        debug_assert_eq!(
            self.ch.tail,
            self.ch.buf.as_bytes().last().copied().unwrap_or(0)
        );
        if breaks && self.space_ends_sentence() {
            self.cut_all(FlushCause::Sentence);
            self.ch.unseen_ws = 1;
            self.ch.unseen_joins = joins;
            return true;
        }
        false
    }

    /// Whether white space that breaks, typed next, would end a sentence at the buffer's end
    /// (`.`, `!` or `?`, quotes closing it, another script's stop).
    #[inline(always)]
    fn space_ends_sentence(&self) -> bool {
        // One load settles the common case, a letter before the space (callgrind: three tests
        // of the byte cost 10 instructions a packet more, once other scripts' ends came).
        let class = TAIL_CLASS[usize::from(self.ch.tail)];
        class != 0
            && (class & TAIL_STOP != 0
                || (class & TAIL_CLOSE != 0 && ends_quoted_sentence(&self.ch.buf))
                || (class & TAIL_OTHER != 0 && ends_other_sentence(&self.ch.buf)))
    }

    fn push(&mut self, c: char) {
        if (may_end_ideographic(self.ch.tail) || self.ch.end_held) && !is_ideographic_end(c) {
            self.cut_ideographic_end(c);
        }
        if self.ch.chars >= self.cuts.max_chars {
            self.end_held_cut(c);
        }
        if c.is_whitespace() && self.white_space_taken(!is_no_break(c), !c.is_control()) {
            return;
        }
        self.ch.first_room(c.len_utf8());
        self.ch.buf.push(c);
        self.ch.sync_tail();
        self.ch.chars += 1;
        if self.ch.chars >= self.cuts.max_chars {
            self.cut_size(true);
        }
    }

    /// A size cut held for the character after a full buffer with no white space to cut at,
    /// or ending a sentence if white space comes ([`Fed::cut_size`]): made now, before `c`,
    /// unless `c` continues the buffer's last grapheme cluster (UAX #29: a combining mark, a
    /// ZWJ sequence, a flag's second half) or its ideographic sentence end (`？！`, and
    /// `。\u{301}！`: README, chunking, a mark that extends an end goes with it), closes a
    /// sentence (the `"` of `"Stop."`) or is a stop (no chunk is a lone `.`), and the hold
    /// has not run [`MAX_HELD`] characters past the limit. White space that breaks is left to
    /// the usual path, which cuts there: after `.`, `!` or `?` as a sentence end, else as the
    /// size cut at that space. A no-break space is no place to cut, and starts a cluster (which
    /// a combining mark may continue): the cut is made before it.
    #[cold]
    #[inline(never)]
    fn end_held_cut(&mut self, c: char) {
        if is_break_space(c) {
            return;
        }
        let over = self.ch.chars - self.cuts.max_chars;
        let joins = ((is_ideographic_end(c) || is_ideographic_close(c))
            && self.ch.held_end().is_some())
            || (is_closing(c) && in_sentence_end(&self.ch.buf))
            || is_sentence_stop(c)
            || continues_cluster(&mut self.ch.buf, c);
        if over >= MAX_HELD || !joins {
            // At the last white space that breaks, if a sentence end held one in the buffer.
            self.cut_size(false);
        }
    }

    /// Cuts a buffer ending in an ideographic sentence end, before `next`, a character that is
    /// not one: the end is held until then so that `？！` or `。。。` stays one sentence end, as
    /// `?!` waits for its space. It is held too while `next` extends the end's grapheme
    /// cluster (UAX #29 GB9: a combining mark, U+FE0F, a ZWJ), as the held size cut is, at most
    /// [`MAX_HELD`] characters: a cluster erase (t140llm) takes the end with its marks, and no
    /// chunk starts with a lone mark.
    #[inline(never)]
    fn cut_ideographic_end(&mut self, next: char) {
        let Some(held) = self.ch.held_end() else {
            self.ch.end_held = false;
            return;
        };
        // No ASCII character extends a cluster (UAX #29: none is Extend, ZWJ or a SpacingMark);
        // of ASCII, only `)` and `]` close a CJK sentence (`(好。)`).
        if held < MAX_HELD
            && (is_ideographic_close(next) || (!next.is_ascii() && extends_end(next)))
        {
            self.ch.end_held = true;
            return;
        }
        self.cut_all(FlushCause::Sentence);
    }

    /// An ASCII run after an ideographic sentence end, held or not: the `)` and `]` it starts
    /// with close the sentence (`(好。)`) and are held with the end, a character at a time;
    /// the next character cuts it (none of ASCII extends a cluster). The rest of the run.
    #[inline(never)]
    fn ascii_after_end<'s>(&mut self, s: &'s [u8]) -> &'s [u8] {
        let closers = s.iter().take_while(|&&b| matches!(b, b')' | b']')).count();
        let (held, rest) = s.split_at(closers);
        for &b in held {
            self.push(char::from(b));
        }
        if let Some(&b) = rest.first() {
            self.cut_ideographic_end(char::from(b));
        }
        rest
    }

    /// Out of line: a sentence end is rare next to the characters that pass the checks above it,
    /// and inlined, the cut weighs on the per-character path's code.
    #[inline(never)]
    fn cut_all(&mut self, cause: FlushCause) {
        if let Some(c) = self.ch.flush(cause) {
            self.push_ready(c);
        }
    }

    fn push_ready(&mut self, c: Chunk) {
        self.cuts.ready.push_back(c);
    }

    /// Size cut at the last white space that breaks, keeping the word in progress for the next
    /// chunk. The white space dropped there (the space cut at and any trimmed before it) is
    /// counted as unseen, so backspaces erase it before the chunk. With no such white space the
    /// whole buffer is cut, but between grapheme clusters: when `hold`, the next character may
    /// still belong to the last one, so the cut waits for it ([`Fed::end_held_cut`]).
    fn cut_size(&mut self, hold: bool) {
        match self.ch.buf.rfind(is_break_space) {
            // The buffer ends a sentence if white space comes next (`Say hello.` at 10): held
            // for that character, so a sentence that fits exactly goes whole, as a sentence;
            // anything else cuts at this white space then ([`Fed::end_held_cut`]).
            Some(_) if hold && self.space_ends_sentence() => {}
            Some(at) => {
                let ws = self.ch.buf[at..].chars().next();
                let ws_len = ws.map_or(1, char::len_utf8);
                let head = &self.ch.buf[..at];
                let body = head.trim_end();
                let dropped = clamp(head[body.len()..].chars().count() + 1);
                let text = body.trim_start();
                let lead = clamp(body[..body.len() - text.len()].chars().count());
                let before = self.ch.unseen_ws.saturating_add(lead);
                // Known to join only when the white space cut at is all that is unseen.
                let joins = ws.is_some_and(|c| !c.is_control()) && dropped == 1;
                if all_blank(text) {
                    // Invisible characters only count as white space (`take_chunk`).
                    let hidden = clamp(text.chars().count());
                    self.ch.unseen_joins = before == 0 && joins && hidden == 0;
                    self.ch.unseen_ws = before.saturating_add(hidden).saturating_add(dropped);
                } else {
                    let c = Chunk {
                        text: text.to_owned(),
                        cause: FlushCause::Size,
                        space_before: before,
                    };
                    // The buffer now follows this chunk, the white space cut at between.
                    self.ch.after_cut = AfterCut::of(&c.text);
                    self.push_ready(c);
                    self.ch.unseen_joins = joins;
                    self.ch.unseen_ws = dropped;
                }
                self.ch.buf.replace_range(..at + ws_len, "");
                self.ch.sync_tail();
                self.ch.chars = clamp(self.ch.buf.chars().count());
                // What a held sentence end ran past the limit (`Say hello?!!!` at 10) is still
                // over it: cut too, unless the next character may join it.
                if !hold && self.ch.chars >= self.cuts.max_chars {
                    self.cut_all(FlushCause::Size);
                }
            }
            None if hold => {}
            None => self.cut_all(FlushCause::Size),
        }
    }
}

/// Characters a held size cut may run past the limit: Unicode's stream-safe text format (UAX
/// #15) has at most 30 combining characters in a row, and a ZWJ emoji sequence is shorter.
pub const MAX_HELD: u32 = 32;

/// Whether `c` would continue the last grapheme cluster of `buf` (UAX #29), rather than start
/// one. Asked only of a held size cut.
fn continues_cluster(buf: &mut String, c: char) -> bool {
    use unicode_segmentation::UnicodeSegmentation;
    let len = buf.len();
    buf.push(c);
    let joins = buf
        .grapheme_indices(true)
        .next_back()
        .is_some_and(|(at, _)| at < len);
    buf.truncate(len);
    joins
}

/// Whether `c` continues the grapheme cluster of an ideographic sentence end and what extended
/// it (UAX #29 GB9, GB9a: an Extend or SpacingMark character, a ZWJ). The end is an ordinary
/// character (class Other), so the marks after it do not change what continues its cluster, and
/// the pair is read on the stack: no allocation on the per-character path.
fn extends_end(c: char) -> bool {
    use unicode_segmentation::UnicodeSegmentation;
    let mut pair = [0; 7];
    let end = '。'.encode_utf8(&mut pair).len();
    let len = end + c.encode_utf8(&mut pair[end..]).len();
    std::str::from_utf8(&pair[..len]).is_ok_and(|s| s.graphemes(true).nth(1).is_none())
}

/// Characters after the ideographic sentence end in the last grapheme cluster of `buf` (UAX
/// #29), or `None` when that cluster has none. The end need not begin the cluster: a Prepend
/// character (GB9b: U+0600 ARABIC NUMBER SIGN) joins it to what follows. Only what extends
/// the end (GB9, GB9a) follows it in its cluster, and two ends never share one.
fn held_past_end(buf: &str) -> Option<u32> {
    use unicode_segmentation::UnicodeSegmentation;
    let (_, last) = buf.grapheme_indices(true).next_back()?;
    let at = last.rfind(is_ideographic_end)?;
    Some(clamp(last[at..].chars().count() - 1))
}

/// Counts are kept in 32 bits (a chunker sits in its stream's hot cache line); a count beyond
/// that saturates.
fn clamp(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Ends a sentence with no white space after it (CJK text has none).
fn is_ideographic_end(c: char) -> bool {
    matches!(c, '。' | '！' | '？')
}

/// Closing brackets and quotes that follow an ideographic sentence end in CJK text (`「本当？」`,
/// `“好。”`): part of the sentence they close, held with its end ([`Fed::cut_ideographic_end`]).
fn is_ideographic_close(c: char) -> bool {
    matches!(
        c,
        '」' | '』'
            | '）'
            | '］'
            | '｝'
            | '】'
            | '〕'
            | '〗'
            | '〙'
            | '〛'
            | '〉'
            | '》'
            | '｣'
            | '\u{2019}'
            | '\u{201d}'
            | ')'
            | ']'
    )
}

/// The last bytes of `。` (E3 80 82), `！` (EF BC 81) and `？` (EF BC 9F): a buffer whose last
/// byte is none of them does not end a sentence so, and is not read to find out.
#[inline]
fn may_end_ideographic(tail: u8) -> bool {
    matches!(tail, 0x81 | 0x82 | 0x9f)
}

/// Closing quotes and brackets, which may follow a sentence's `.`, `!` or `?` (`"Stop."`,
/// `(see above.)`, `“Really?”`) before the white space that ends it; German and Czech close
/// with `“` and `‘` (`„Stopp.“`), German books with `«` and `‹` (`»Stopp.«`).
fn is_closing(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | ')'
            | ']'
            | '\u{ab}'
            | '\u{bb}'
            | '\u{2018}'
            | '\u{2019}'
            | '\u{201c}'
            | '\u{201d}'
            | '\u{2039}'
            | '\u{203a}'
    )
}

/// A closing quote or bracket the chunker holds with the sentence end it closes, Latin
/// (`"Stop."`) or ideographic (`「本当？」`): the fuzz targets' chunk-size
/// oracle asks the chunker rather than keep a copy of the lists that goes out of date.
pub fn holds_with_an_end(c: char) -> bool {
    is_closing(c) || is_ideographic_close(c)
}

/// [`TAIL_CLASS`]: the byte is `.`, `!` or `?`.
const TAIL_STOP: u8 = 1;
/// [`TAIL_CLASS`]: the byte may end a closing character ([`may_close`]).
const TAIL_CLOSE: u8 = 2;
/// [`TAIL_CLASS`]: the byte ends a character beyond ASCII (another script's end may be it).
const TAIL_OTHER: u8 = 4;

/// What a buffer's last byte says of a sentence end at the white space after it
/// ([`Fed::white_space_taken`]): 0 for nearly every byte, a letter's.
static TAIL_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        let mut class = 0;
        if matches!(byte, b'.' | b'!' | b'?') {
            class |= TAIL_STOP;
        }
        if may_close(byte) {
            class |= TAIL_CLOSE;
        }
        if byte >= 0x80 {
            class |= TAIL_OTHER;
        }
        t[b] = class;
        b += 1;
    }
    t
};

/// The last bytes of the closing characters ([`is_closing`]): `"`, `'`, `)`, `]`, and those
/// of `«` (C2 AB), `»` (C2 BB), `‘` (E2 80 98), `’` (E2 80 99), `“` (E2 80 9C), `”` (E2 80 9D),
/// `‹` (E2 80 B9) and `›` (E2 80 BA). A buffer whose last byte is none of them is not read to
/// find a quoted sentence end.
#[inline]
const fn may_close(tail: u8) -> bool {
    matches!(
        tail,
        b'"' | b'\'' | b')' | b']' | 0xab | 0xbb | 0x98 | 0x99 | 0x9c | 0x9d | 0xb9 | 0xba
    )
}

/// Whether `buf` ends in `.`, `!` or `?` followed by closing quotes or brackets, and the
/// no-break spaces French typography puts inside guillemets (`« Bonjour.\u{a0}»`): a sentence
/// end once white space follows, as a bare `.` is. Out of line: asked only when the buffer
/// ends in such a byte and white space comes.
#[cold]
#[inline(never)]
fn ends_quoted_sentence(buf: &str) -> bool {
    buf.ends_with(is_closing) && in_sentence_end(buf)
}

/// Whether `buf` ends in `.`, `!` or `?`, closing quotes or brackets and no-break spaces
/// after it or not: a closing character next is held with it past the size limit
/// ([`Fed::end_held_cut`]), as `？」` is, so no chunk starts with the `"` of `"Stop."`.
fn in_sentence_end(buf: &str) -> bool {
    (buf.trim_end_matches(|c| is_closing(c) || is_no_break(c))).ends_with(is_sentence_stop)
}

/// A sentence's stop that white space after it (closing characters between) ends the sentence
/// at: `.`, `!`, `?` and other scripts' (`؟ ۔ । ॥ ։ ።`...). The fuzz targets' chunk-size
/// oracle asks this rather than keep a copy of the list.
pub fn is_sentence_stop(c: char) -> bool {
    matches!(c, '.' | '!' | '?') || is_spaced_end(c)
}

/// Sentence terminators of other scripts (Unicode Sentence_Terminal), which end a sentence
/// once white space follows, as `.` does: Arabic `؟`, Urdu `۔`, the Devanagari dandas `।` and
/// `॥` (Hindi, Bengali, Punjabi...), Armenian `։`, Ethiopic `።`, `፧` and `፨`, Myanmar `။`,
/// Khmer `។` and `៕`, Mongolian `᠃`, `‼`, `⁇`, `⁈`, `⁉`, and the full-width and small forms
/// of `.`, `!` and `?` (no white space follows them in CJK text, so `３．１４` is not cut).
fn is_spaced_end(c: char) -> bool {
    matches!(
        c,
        '\u{61f}'
            | '\u{6d4}'
            | '\u{964}'
            | '\u{965}'
            | '\u{589}'
            | '\u{1362}'
            | '\u{1367}'
            | '\u{1368}'
            | '\u{104b}'
            | '\u{17d4}'
            | '\u{17d5}'
            | '\u{1803}'
            | '\u{203c}'
            | '\u{2047}'
            | '\u{2048}'
            | '\u{2049}'
            | '\u{ff0e}'
            | '\u{ff61}'
            | '\u{fe52}'
            | '\u{fe56}'
            | '\u{fe57}'
    )
}

/// Whether `buf`, ending in a character that is not ASCII, ends a sentence once white space
/// follows: a terminator of another script ([`is_spaced_end`]), or closing quotes after one,
/// or any sentence end followed by bidirectional marks (`مرحبا.\u{200f}`: the mark keeps the
/// stop on the right side of RTL text, and is invisible) or a variation selector (`‼️`). Asked only at white space after
/// such a character, not per character.
#[cold]
#[inline(never)]
fn ends_other_sentence(buf: &str) -> bool {
    let body = buf.trim_end_matches(is_invisible_after_end);
    body.ends_with(is_spaced_end)
        || (body.len() < buf.len() && body.ends_with(['.', '!', '?']))
        || ends_quoted_sentence(body)
}

/// The invisible marks that set the direction of neutral characters (LRM, RLM and the Arabic
/// letter mark), and the variation selectors that pick a glyph (`‼\u{fe0f}`, the emoji `‼️`).
fn is_invisible_after_end(c: char) -> bool {
    matches!(
        c,
        '\u{200e}' | '\u{200f}' | '\u{61c}' | '\u{fe0e}' | '\u{fe0f}'
    )
}

/// No-break spaces: white space that keeps its neighbours together (Unicode line breaking class
/// GL), so neither a sentence end nor a place to cut.
fn is_no_break(c: char) -> bool {
    matches!(c, '\u{a0}' | '\u{2007}' | '\u{202f}')
}

/// Whether `s` begins with what extends the cluster before it (a combining mark, a
/// variation selector, a joiner), so that after a space the two are one cluster.
fn joins_a_space(s: &str) -> bool {
    use unicode_segmentation::UnicodeSegmentation;
    let mut t = String::with_capacity(1 + s.len());
    t.push(' ');
    t.push_str(s);
    t.graphemes(true).next().is_some_and(|g| g.len() > 1)
}

/// The viramas that link consonants into one grapheme cluster (Unicode 15.1 InCB=Linker:
/// Devanagari, Bengali, Gujarati, Oriya, Telugu, Malayalam).
fn is_linker(c: char) -> bool {
    matches!(
        c,
        '\u{94d}' | '\u{9cd}' | '\u{acd}' | '\u{b4d}' | '\u{c4d}' | '\u{d4d}'
    )
}

/// Whether a consonant after `text` (ending in a virama) would continue its last grapheme
/// cluster (UAX #29 GB9c: consonant, virama, consonant).
fn links_a_consonant(text: &str) -> bool {
    use unicode_segmentation::UnicodeSegmentation;
    let Some(last) = text.graphemes(true).next_back() else {
        return false;
    };
    let mut t = String::with_capacity(last.len() + 3);
    t.push_str(last);
    t.push('\u{915}');
    t.graphemes(true).nth(1).is_none()
}

/// Whether `s` begins with what joins a consonant and virama before it into one grapheme
/// cluster (a consonant, UAX #29 GB9c).
fn joins_a_conjunct(s: &str) -> bool {
    use unicode_segmentation::UnicodeSegmentation;
    let mut t = String::with_capacity(6 + s.len());
    t.push_str("\u{915}\u{94d}");
    t.push_str(s);
    t.graphemes(true).next().is_some_and(|g| g.len() > 6)
}

/// Removes the last grapheme cluster (UAX #29) of `s`; the characters it had.
pub fn pop_cluster(s: &mut String) -> u32 {
    use unicode_segmentation::UnicodeSegmentation;
    let at = s.grapheme_indices(true).next_back().map_or(0, |(i, _)| i);
    let erased = clamp(s[at..].chars().count());
    s.truncate(at);
    erased
}

/// Whether `text` is nothing but [`blank`] characters: no chunk of it is sent, and an item
/// erased down to it is removed (README "What it emits", "Text decoding").
#[inline]
pub fn all_blank(text: &str) -> bool {
    text.chars().all(blank)
}

/// White space, or a character that shows nothing (Unicode Default_Ignorable_Code_Point: a
/// zero-width space or joiner, a direction mark, a word joiner, a soft hyphen, a variation
/// selector, the Hangul fillers, a tag): a chunk of these only is never sent, and a name of
/// these only is no name ([`crate::gateway::shows_nothing`]).
#[inline]
pub fn blank(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '\u{ad}'
                | '\u{34f}'
                | '\u{61c}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0000}'..='\u{e0fff}'
        )
}

fn is_break_space(c: char) -> bool {
    c.is_whitespace() && !is_no_break(c)
}

impl TextSink for Fed<'_> {
    #[inline]
    fn push_char(&mut self, c: char) {
        self.push(c);
    }

    fn new_line(&mut self) {
        self.push('\n');
    }

    /// `Chunker::push` for printable ASCII, where the only white space is the space and no
    /// character is an ideographic sentence end (so one held is cut before the run).
    /// Inlined always: the decoder's fast path calls it for nearly every packet (measured
    /// outlined, 12 instructions a packet more, once a second caller came).
    #[inline(always)]
    fn push_ascii(&mut self, s: &[u8]) {
        let s = if may_end_ideographic(self.ch.tail) || self.ch.end_held {
            self.ascii_after_end(s)
        } else {
            s
        };
        if let (true, Some(&b)) = (self.ch.chars >= self.cuts.max_chars, s.first()) {
            self.end_held_cut(char::from(b));
        }
        self.ch.first_room(s.len());
        let mut rest = s;
        while let [b, tail @ ..] = rest {
            let b = *b;
            rest = tail;
            if b == b' ' && self.white_space_taken(true, true) {
                continue;
            }
            // `& 0x7f` is a no-op on ASCII that lets the compiler emit a one-byte push.
            self.ch.buf.push(char::from(b & 0x7f));
            self.ch.tail = b;
            self.ch.chars += 1;
            if self.ch.chars >= self.cuts.max_chars {
                // Mid-run the next character is ASCII after ASCII: a cluster boundary, so
                // the cut is made now unless the next is the space, which cuts as it would
                // (a sentence end after `.`), or a stop, or closes a sentence (`"Stop."`),
                // held as far as a held cut is; at the run's end, the next may join the
                // cluster.
                self.cut_size(rest.first().is_none_or(|&n| {
                    n == b' '
                        || (self.ch.chars - self.cuts.max_chars < MAX_HELD
                            && (matches!(n, b'.' | b'!' | b'?')
                                || (may_close(n) && in_sentence_end(&self.ch.buf))))
                }));
            }
        }
    }

    /// Erases the last character typed (T.140 U+0008): buffered text first, then the white
    /// space typed before it, then the chunk cut in this packet (not yet handed out, so
    /// reopened, with the white space typed before it as unseen), then, as `erase_sent`, sent
    /// text. Returns false for that last: nothing not yet sent was erased, which the decoder
    /// counts as `backspace_unmatched` (README "Metrics": `_backspace_unmatched_total`).
    fn backspace(&mut self) -> bool {
        if self.cuts.clusters && !self.ch.buf.is_empty() {
            let first = self.ch.buf.chars().count() == 1 || {
                use unicode_segmentation::UnicodeSegmentation;
                self.ch.buf.graphemes(true).nth(1).is_none()
            };
            // The buffer's one cluster may have begun on the white space kept out of it (a
            // combining mark or joiner after a space is one cluster with it, UAX #29 GB9):
            // erased together.
            let on_space = first
                && self.ch.unseen_ws > 0
                && self.ch.unseen_joins
                && joins_a_space(&self.ch.buf);
            // Or on the text cut before it, with nothing between: an idle flush came between a
            // base character and the mark extending it, so the cluster the sender erases is
            // split between the cut text and the buffer, and the erase goes on into the cut
            // text (reopened if not yet handed out, else corrected as sent text).
            let on_cut = first
                && !on_space
                && self.ch.after_cut != AfterCut::No
                && self.ch.unseen_ws == 0
                && (joins_a_space(&self.ch.buf)
                    || (self.ch.after_cut == AfterCut::Linked && joins_a_conjunct(&self.ch.buf)));
            let erased = pop_cluster(&mut self.ch.buf);
            self.ch.sync_tail();
            self.ch.chars = self.ch.chars.saturating_sub(erased);
            if on_space {
                self.ch.unseen_ws -= 1;
            }
            if on_cut {
                self.backspace();
            }
            return true;
        }
        if self.ch.buf.pop().is_some() {
            self.ch.sync_tail();
            self.ch.chars -= 1;
            return true;
        }
        // White space typed after the cut text: once none is left, the buffer follows that
        // text again, and a mark typed next extends its last character (`after_cut` kept; while
        // some is left, `unseen_ws` keeps the erase off the cut text).
        if self.ch.unseen_ws > 0 {
            self.ch.unseen_ws -= 1;
            return true;
        }
        // Past that, what a mark typed next extends is no longer the cut text's last
        // character as it was cut: no cluster erase goes on into it.
        self.ch.after_cut = AfterCut::No;
        if let Some(last) = self.cuts.ready.pop_back() {
            // Cut in this packet but not handed out yet: reopen it as the buffer.
            self.ch.buf.push_str(&last.text);
            if self.cuts.clusters {
                pop_cluster(&mut self.ch.buf);
            } else {
                self.ch.buf.pop();
            }
            self.ch.sync_tail();
            self.ch.chars = clamp(self.ch.buf.chars().count());
            self.ch.unseen_ws = last.space_before;
            self.ch.unseen_joins = false;
            // What is left may end in an ideographic end held with its marks.
            self.ch.end_held = true;
            return true;
        }
        self.ch.erase_sent = self.ch.erase_sent.saturating_add(1);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunker with its own [`Cuts`], as one speaker of a gateway.
    struct Pair {
        ch: Chunker,
        cuts: Cuts,
    }

    impl Pair {
        fn new(max_chars: usize) -> Self {
            Pair {
                ch: Chunker::new(),
                cuts: Cuts::new(max_chars),
            }
        }

        fn s(&mut self) -> Fed<'_> {
            self.ch.fed(&mut self.cuts)
        }
    }

    fn feed(ch: &mut Pair, s: &str) -> Vec<(String, FlushCause)> {
        for c in s.chars() {
            if c == '\u{8}' {
                ch.s().backspace();
            } else {
                ch.s().push_char(c);
            }
        }
        ch.cuts.drain().map(|c| (c.text, c.cause)).collect()
    }

    #[test]
    fn chunks_cut_in_one_packet_are_taken_in_order() {
        let mut ch = Pair::new(10);
        ch.s().push_ascii(b"One. ");
        assert_eq!(ch.cuts.pop().map(|c| c.text).as_deref(), Some("One."));
        assert!(ch.cuts.is_empty());
        // A size cut and a sentence end in one packet: both kept, in order.
        ch.s().push_ascii(b"abcd efgh ijkl. ");
        let cut: Vec<String> = std::iter::from_fn(|| ch.cuts.pop().map(|c| c.text)).collect();
        assert_eq!(cut, ["abcd efgh", "ijkl."]);
    }

    /// A sentence typed three characters a packet fills one allocation: no regrowth (and copy)
    /// on the way. The chunk takes that allocation, and a recycled one serves the next
    /// sentence: two allocations circulate.
    #[test]
    fn a_sentence_fits_the_first_allocation_and_allocations_circulate() {
        let mut ch = Pair::new(500);
        let sentence = b"The quick brown fox jumps over the lazy dog near the river. ";
        assert_eq!(sentence.len(), FIRST_CAPACITY - 4);
        let mut kept: Option<String> = None;
        let mut seen = Vec::new();
        for _ in 0..4 {
            ch.s().push_ascii(&sentence[..3]);
            let at = ch.ch.buf.as_ptr();
            assert_eq!(ch.ch.buf.capacity(), FIRST_CAPACITY);
            // The space after the full stop cuts the chunk.
            for piece in sentence.chunks(3).skip(1) {
                ch.s().push_ascii(piece);
                if !ch.cuts.is_empty() {
                    break;
                }
                assert_eq!(ch.ch.buf.as_ptr(), at, "{:?}", ch.ch.buf);
            }
            let cut = ch.cuts.pop().expect("a sentence");
            assert_eq!(cut.text, sentence.trim_ascii().escape_ascii().to_string());
            assert_eq!(cut.text.as_ptr(), at, "the chunk took the buffer, no copy");
            assert_eq!(ch.ch.buf.capacity(), 0);
            seen.push(at);
            // As the gateway does once the chunk's envelope is made.
            if let Some(old) = kept.replace(cut.text) {
                ch.ch.recycle(old);
            }
        }
        assert_eq!(seen[2], seen[0], "{seen:?}");
        assert_eq!(seen[3], seen[1], "{seen:?}");
        // Beyond the first allocation, growth doubles as before.
        ch.s().push_ascii(&[b'x'; 65]);
        assert_eq!(ch.ch.buf.capacity(), 2 * FIRST_CAPACITY);
    }

    #[test]
    fn recycling_keeps_only_what_the_buffer_can_use() {
        let mut ch = Pair::new(500);
        ch.s().push_ascii(b"typing");
        let at = ch.ch.buf.as_ptr();
        ch.ch.recycle(String::with_capacity(64));
        assert_eq!(ch.ch.buf.as_ptr(), at, "a buffer in use is not replaced");
        assert_eq!(ch.ch.pending(), "typing");
        let mut ch = Pair::new(500);
        let mut old = String::with_capacity(100);
        old.push_str("sent before");
        ch.ch.recycle(old);
        assert!(ch.ch.buf.capacity() >= 100);
        assert_eq!(ch.ch.pending(), "", "recycled text is cleared");
        assert_eq!(
            feed(&mut ch, "Next one. "),
            [("Next one.".into(), FlushCause::Sentence)]
        );
    }

    #[test]
    fn a_cut_trims_in_place() {
        let mut ch = Pair::new(500);
        assert_eq!(
            feed(&mut ch, "  spaced   words \n\n"),
            Vec::<(String, FlushCause)>::new()
        );
        assert_eq!(
            ch.ch.flush(FlushCause::Idle).map(|c| c.text),
            Some("spaced   words".into())
        );
        // White space only: nothing is cut, and the buffer keeps its allocation.
        feed(&mut ch, "x");
        ch.s().backspace();
        feed(&mut ch, "   ");
        let cap = ch.ch.buf.capacity();
        assert_eq!(ch.ch.flush(FlushCause::Idle), None);
        assert_eq!(ch.ch.buf.capacity(), cap);
    }

    #[test]
    fn sentence_ends_flush_but_decimals_and_abbreviations_mid_word_do_not() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "Pi is 3.14 e.g.x here. Really? Yes! ");
        assert_eq!(
            out,
            vec![
                ("Pi is 3.14 e.g.x here.".into(), FlushCause::Sentence),
                ("Really?".into(), FlushCause::Sentence),
                ("Yes!".into(), FlushCause::Sentence),
            ]
        );
        assert_eq!(ch.ch.pending(), "");
    }

    #[test]
    fn newline_after_terminator_ends_a_sentence_and_inner_newlines_stay() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "line one\nline two.\nnext");
        assert_eq!(
            out,
            vec![("line one\nline two.".into(), FlushCause::Sentence)]
        );
        assert_eq!(ch.ch.pending(), "next");
    }

    #[test]
    fn terminator_at_end_waits_for_idle() {
        let mut ch = Pair::new(500);
        assert!(feed(&mut ch, "Done.").is_empty());
        assert_eq!(
            ch.ch.flush(FlushCause::Idle).map(|c| (c.text, c.cause)),
            Some(("Done.".into(), FlushCause::Idle))
        );
        assert_eq!(ch.ch.flush(FlushCause::End), None);
    }

    /// CJK text has no space after a sentence: an ideographic end is cut before the next
    /// character, whatever it is, where `.` waits for white space. Last in the text, it waits
    /// for the idle flush, as `Done.` does.
    #[test]
    fn ideographic_terminators_cut_at_the_next_character() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "日本語です。次！");
        assert_eq!(out, vec![("日本語です。".into(), FlushCause::Sentence)]);
        assert_eq!(ch.ch.pending(), "次！");
        // ASCII text after it (the fast path) and a new line cut it too.
        let mut ch = Pair::new(500);
        feed(&mut ch, "はい。");
        ch.s().push_ascii(b"OK");
        let out: Vec<String> = feed(&mut ch, "？\n").into_iter().map(|c| c.0).collect();
        assert_eq!(out, ["はい。", "OK？"]);
        assert_eq!(ch.ch.pending(), "");
    }

    /// An ideographic end is held while the characters after it extend its grapheme cluster
    /// (UAX #29 GB9: a combining mark, U+FE0F, a ZWJ, a skin tone) and cut with them before
    /// the first that neither does nor is another end: with [`Cuts::erase_clusters`]
    /// (t140llm) the sender's backspace erases "。\u{301}" whole, so "はい" is left and
    /// nothing cut; without it no chunk starts with a lone mark. A review found the end cut
    /// before the mark, so "はい。" was sent with the full stop the sender erased (review,
    /// session 35).
    #[test]
    fn a_cluster_erase_takes_an_ideographic_end_with_the_mark_that_extends_it() {
        let mut ch = Pair::new(500);
        ch.cuts.erase_clusters(true);
        let cut = feed(&mut ch, "はい。\u{301}\u{8}");
        assert!(
            cut.is_empty(),
            "the full stop the sender erased was cut to be sent: {cut:?}"
        );
        assert_eq!(ch.ch.pending(), "はい");
        assert_eq!(ch.ch.take_erase_sent(), 0);
        // A character after the backspace cuts nothing: no end is held any more.
        assert!(feed(&mut ch, "x").is_empty());
        // Without cluster erase: the end is cut with its marks, before the next character, a
        // character at a time or an ASCII run; another end keeps the run one sentence end.
        for (text, sentence, after) in [
            ("はい。\u{301}次", "はい。\u{301}", "次"),
            ("はい。\u{fe0f}\u{301}x", "はい。\u{fe0f}\u{301}", "x"),
            ("はい。\u{301}。\u{301}\n", "はい。\u{301}。\u{301}", ""),
            ("本当？\u{200d}\u{1f600}", "本当？\u{200d}", "\u{1f600}"),
        ] {
            let mut ch = Pair::new(500);
            let cut = feed(&mut ch, text);
            assert_eq!(cut, [(sentence.into(), FlushCause::Sentence)], "{text:?}");
            assert_eq!(ch.ch.pending(), after, "{text:?}");
        }
        let mut ch = Pair::new(500);
        feed(&mut ch, "はい。\u{fe0f}");
        ch.s().push_ascii(b"OK");
        let cut: Vec<_> = ch.cuts.drain().map(|c| c.text).collect();
        assert_eq!(cut, ["はい。\u{fe0f}"]);
        assert_eq!(ch.ch.pending(), "OK");
        // A chunk reopened by a backspace and left ending in a held end is cut as one.
        let mut ch = Pair::new(500);
        assert!(feed(&mut ch, "はい。\u{301}\u{301}x\u{8}\u{8}").is_empty());
        assert_eq!(ch.ch.pending(), "はい。\u{301}");
        let cut = feed(&mut ch, "y");
        assert_eq!(cut, [("はい。\u{301}".into(), FlushCause::Sentence)]);
        // Bounded as the held size cut is.
        let mut ch = Pair::new(500);
        let text: String = "。"
            .chars()
            .chain(std::iter::repeat_n('\u{301}', 40))
            .collect();
        let cut = feed(&mut ch, &text);
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0].0.chars().count(), 1 + MAX_HELD as usize);
        assert_eq!(ch.ch.pending().chars().count(), 40 - MAX_HELD as usize);
    }

    /// An ideographic end after a Prepend character (UAX #29 GB9b: U+0600 ARABIC NUMBER
    /// SIGN), which joins the end into its grapheme cluster, is held with the mark that
    /// extends it and cut before the next character, as without the mark. A review found the
    /// hold looking for the end only at the cluster's start, so the sentence end was dropped
    /// and never cut (review, session 35).
    #[test]
    fn an_ideographic_end_after_a_prepend_character_is_still_cut_once_a_mark_extends_it() {
        let mut ch = Pair::new(500);
        assert_eq!(
            feed(&mut ch, "\u{600}。x"),
            [("\u{600}。".to_owned(), FlushCause::Sentence)]
        );
        let mut ch = Pair::new(500);
        let cut = feed(&mut ch, "\u{600}。\u{301}x");
        assert_eq!(
            cut,
            [("\u{600}。\u{301}".to_owned(), FlushCause::Sentence)],
            "the sentence end was lost: pending {:?}",
            ch.ch.pending()
        );
        assert_eq!(ch.ch.pending(), "x");
    }

    #[test]
    fn size_cut_at_last_word_boundary() {
        let mut ch = Pair::new(10);
        let out = feed(&mut ch, "abc defgh ijk");
        assert_eq!(out, vec![("abc defgh".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "ijk");
        // No boundary: cut whole, counting characters, not bytes.
        let mut ch = Pair::new(4);
        let out = feed(&mut ch, "日本語😀x");
        assert_eq!(out, vec![("日本語😀".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "x");
    }

    /// A sentence that fills the limit exactly goes whole, as a sentence: the size cut waits
    /// for the next character, which ends the sentence if it is white space and else cuts at
    /// the last space as before. A stop after a word that filled the limit is held with it,
    /// not sent as a chunk of its own. (Before session 47, `Say hello.` at 10 went as `Say`
    /// then `hello.`, and `abcdefghij.` at 10 as `abcdefghij` then `.`.)
    #[test]
    fn a_sentence_that_fills_the_limit_goes_whole() {
        for ascii in [true, false] {
            let run = |max: usize, packets: &[&str]| {
                let mut ch = Pair::new(max);
                for p in packets {
                    if ascii {
                        ch.s().push_ascii(p.as_bytes());
                    } else {
                        p.chars().for_each(|c| ch.s().push_char(c));
                    }
                }
                let out: Vec<_> = ch.cuts.drain().map(|c| (c.text, c.cause)).collect();
                (out, ch.ch.pending().to_owned())
            };
            let sentence = |t: &str| vec![(t.to_owned(), FlushCause::Sentence)];
            let size = |t: &str| vec![(t.to_owned(), FlushCause::Size)];
            assert_eq!(
                run(10, &["Say hello. Next"]),
                (sentence("Say hello."), "Next".into())
            );
            assert_eq!(
                run(10, &["Say hello.", " Next"]),
                (sentence("Say hello."), "Next".into())
            );
            assert_eq!(
                run(10, &["Say hello!", "! Go"]),
                (sentence("Say hello!!"), "Go".into())
            );
            assert_eq!(
                run(8, &["Say \"hi.\" Go"]),
                (sentence("Say \"hi.\""), "Go".into())
            );
            // Not a sentence end after all: cut at the space, as before.
            assert_eq!(run(10, &["Say hello.x"]), (size("Say"), "hello.x".into()));
            assert_eq!(
                run(10, &["Say hello.", "x"]),
                (size("Say"), "hello.x".into())
            );
            assert_eq!(run(10, &["Go abcdefg."]), (size("Go"), "abcdefg.".into()));
            // A word that fills the limit keeps its stop.
            assert_eq!(
                run(10, &["abcdefghij. Next"]),
                (sentence("abcdefghij."), "Next".into())
            );
            assert_eq!(
                run(10, &["abcdefghij", ". Next"]),
                (sentence("abcdefghij."), "Next".into())
            );
            assert_eq!(
                run(10, &["abcdefghij.com"]),
                (size("abcdefghij."), "com".into())
            );
            // Stops held past the limit, then no sentence end after all: the cut at the space
            // leaves them over the limit, cut too before the next character (fuzz, t140_decode).
            let cut = vec![
                ("Say".to_owned(), FlushCause::Size),
                ("hello?!!!!".to_owned(), FlushCause::Size),
            ];
            assert_eq!(run(10, &["Say hello?!!!!x"]), (cut.clone(), "x".into()));
            assert_eq!(run(10, &["Say hello?!!", "!!", "x"]), (cut, "x".into()));
        }
        // A no-break space binds, ending no sentence: cut at the space before.
        let mut ch = Pair::new(10);
        let out = feed(&mut ch, "Say hello.\u{a0}x");
        assert_eq!(out, vec![("Say".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "hello.\u{a0}x");
    }

    /// A size cut with no white space to cut at falls between user-perceived characters
    /// (UAX #29 grapheme clusters), not between a letter and the combining accent typed after
    /// it (decomposed text, as an STT pipeline may send), an emoji and its ZWJ sequence, or the
    /// two halves of a flag. The cut waits for the character that starts the next cluster.
    #[test]
    fn size_cut_keeps_grapheme_clusters_whole() {
        let mut ch = Pair::new(4);
        let out = feed(&mut ch, "abce\u{301}fg");
        assert_eq!(out, vec![("abce\u{301}".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "fg");

        // The same through the ASCII path, the accent arriving in a later packet.
        let mut ch = Pair::new(4);
        ch.s().push_ascii(b"abce");
        assert!(ch.cuts.is_empty(), "held for a combining mark");
        ch.s().push_char('\u{301}');
        ch.s().push_ascii(b"fg");
        let out: Vec<_> = ch.cuts.drain().map(|c| (c.text, c.cause)).collect();
        assert_eq!(out, vec![("abce\u{301}".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "fg");
        // Mid-run, the next ASCII character starts a cluster: cut at once.
        let mut ch = Pair::new(4);
        ch.s().push_ascii(b"abcdefgh");
        let out: Vec<_> = ch.cuts.drain().map(|c| c.text).collect();
        assert_eq!(out, ["abcd"]);
        assert_eq!(ch.ch.pending(), "efgh");

        let mut ch = Pair::new(3);
        let out = feed(&mut ch, "ab\u{1F469}\u{200D}\u{1F4BB}c");
        assert_eq!(
            out,
            vec![("ab\u{1F469}\u{200D}\u{1F4BB}".into(), FlushCause::Size)]
        );
        assert_eq!(ch.ch.pending(), "c");

        let mut ch = Pair::new(1);
        let out = feed(&mut ch, "\u{1F1EB}\u{1F1F7}\u{1F1E9}\u{1F1EA}");
        assert_eq!(out, vec![("\u{1F1EB}\u{1F1F7}".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "\u{1F1E9}\u{1F1EA}");

        // White space ends a held chunk as it ends any other (and is not kept): a sentence
        // end after `.`, else a size cut at that space.
        let mut ch = Pair::new(4);
        let out = feed(&mut ch, "abcd ef");
        assert_eq!(out, vec![("abcd".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "ef");
        let mut ch = Pair::new(4);
        let out = feed(&mut ch, "abc. ef");
        assert_eq!(out, vec![("abc.".into(), FlushCause::Sentence)]);
        assert_eq!(ch.ch.pending(), "ef");
        let mut ch = Pair::new(4);
        ch.s().push_ascii(b"abc.");
        ch.s().push_ascii(b" ef");
        let out: Vec<_> = ch.cuts.drain().map(|c| (c.text, c.cause)).collect();
        assert_eq!(out, vec![("abc.".into(), FlushCause::Sentence)]);
        // A no-break space after a held cut starts the next chunk (it is no place to cut, and
        // a combining mark after it is its own cluster's, not the held one's).
        let mut ch = Pair::new(2);
        let out = feed(&mut ch, "ab\u{a0}\u{591}");
        assert_eq!(out, vec![("ab".into(), FlushCause::Size)]);
        // `？！` at the limit stays one sentence end.
        let mut ch = Pair::new(4);
        let out = feed(&mut ch, "はい？！x");
        assert_eq!(
            out,
            vec![("はい？！".into(), FlushCause::Sentence)],
            "not a lone ！"
        );
        assert_eq!(ch.ch.pending(), "x");
    }

    /// An endless run of combining marks (no text has more than 30 in a row: UAX #15's
    /// stream-safe format) cannot hold a chunk open past the limit by more than that.
    #[test]
    fn a_held_size_cut_is_bounded() {
        let mut ch = Pair::new(4);
        let text: String = "abcd"
            .chars()
            .chain(std::iter::repeat_n('\u{301}', 100))
            .collect();
        let out = feed(&mut ch, &text);
        assert!(!out.is_empty());
        for (chunk, cause) in &out {
            assert_eq!(*cause, FlushCause::Size);
            assert!(
                chunk.chars().count() <= 4 + MAX_HELD as usize,
                "{}",
                chunk.len()
            );
        }
        let total: usize = out.iter().map(|(c, _)| c.chars().count()).sum();
        assert_eq!(total + ch.ch.pending().chars().count(), 104, "nothing lost");
    }

    /// With [`Cuts::erase_clusters`] (t140llm) a backspace erases a whole grapheme cluster:
    /// in the buffer, and in a chunk cut in the same packet and reopened; the character count
    /// follows. Without it, one character.
    #[test]
    fn a_backspace_erases_a_cluster_when_asked_to() {
        let mut ch = Pair::new(500);
        ch.cuts.erase_clusters(true);
        assert!(feed(&mut ch, "ok e\u{301}\u{8}\u{2764}\u{fe0f}\u{8}!").is_empty());
        assert_eq!(ch.ch.pending(), "ok !");
        assert_eq!(ch.ch.chars, 4);
        // "Hi 👍🏽. " is cut at its full stop; three backspaces erase the space after it, then
        // reopen it to erase ".", then the whole thumbs-up with its skin tone.
        let mut ch = Pair::new(500);
        ch.cuts.erase_clusters(true);
        for c in "Hi \u{1f44d}\u{1f3fd}. ".chars() {
            ch.s().push_char(c);
        }
        for _ in 0..3 {
            ch.s().backspace();
        }
        assert!(ch.cuts.is_empty());
        assert_eq!(ch.ch.pending(), "Hi ");
        let mut ch = Pair::new(500);
        assert!(feed(&mut ch, "e\u{301}\u{8}").is_empty());
        assert_eq!(ch.ch.pending(), "e");
    }

    /// A combining mark (or U+FE0F, a skin tone, a ZWJ: every Extend character) after white
    /// space forms one grapheme cluster with that space (UAX #29 GB9): "Hi. \u{301}" is the
    /// clusters `H`, `i`, `.`, ` \u{301}`, and t140llm's `processBackspaces` (Intl.Segmenter)
    /// erases the space and the mark with one U+0008, then the full stop with the next. The
    /// chunker keeps that space outside the buffer (`unseen_ws`: it ended the sentence, or led
    /// the buffer, or was a size cut's), so with [`Cuts::erase_clusters`] the first backspace
    /// erases only the mark, the second only the unseen space, and "Hi." is cut and sent though
    /// the sender erased its full stop. Every later backspace is one cluster behind. Two
    /// backspaces should leave "Hi" buffered and cut nothing.
    #[test]
    fn a_cluster_erase_takes_the_unseen_space_a_combining_mark_belongs_to() {
        let mut ch = Pair::new(500);
        ch.cuts.erase_clusters(true);
        let cut = feed(&mut ch, "Hi. \u{301}\u{8}\u{8}");
        assert!(cut.is_empty(), "the erased full stop was sent: {cut:?}");
        assert_eq!(ch.ch.pending(), "Hi");
        assert_eq!(ch.ch.chars, 2);
    }

    /// The cluster erase above takes the unseen white space with the mark whatever that white
    /// space was: `joins_a_space` asks whether the mark joins a *space*, but `unseen_ws` also
    /// counts a new line (it ends a sentence as a space does). A mark after a new line is no
    /// cluster with it: UAX #29 GB4 breaks after LF (a Control), so "Hi.\n\u{301}" is `H`,
    /// `i`, `.`, `\n`, `\u{301}`, and t140llm's `processBackspaces` erases the mark with one
    /// U+0008 and the new line with the next: the sender's text is "Hi.". Here the first
    /// backspace erases the mark and the unseen new line, and the second reopens "Hi." and
    /// erases its full stop (once "Hi." was sent, a `context.update` to "Hi"): every later
    /// backspace one cluster ahead. Two backspaces should leave "Hi." cut and nothing pending.
    #[test]
    fn a_cluster_erase_leaves_an_unseen_new_line_a_combining_mark_is_no_cluster_with() {
        let mut ch = Pair::new(500);
        ch.cuts.erase_clusters(true);
        let cut = feed(&mut ch, "Hi.\n\u{301}\u{8}\u{8}");
        assert_eq!(
            cut,
            [("Hi.".to_owned(), FlushCause::Sentence)],
            "the full stop the sender kept was erased"
        );
        assert_eq!(ch.ch.pending(), "");
        assert_eq!(ch.ch.chars, 0);
    }

    /// `unseen_joins` is set to false ("not known") whenever a backspace erases one of the
    /// unseen white space, though what is left of it is as much a space as before: "Hi." and
    /// two spaces keep both spaces unseen (`unseen_ws` 2), a backspace erases one of them, and
    /// a combining mark typed then forms the cluster ` \u{301}` with the space left (UAX #29
    /// GB9). t140llm's `processBackspaces` reads "Hi.  \u{8}\u{301}\u{8}\u{8}" as "Hi. ",
    /// "Hi. \u{301}", "Hi.", "Hi": the sender's text is "Hi". Here the second backspace erases
    /// only the mark (`unseen_joins` false), the third the space, and "Hi." is cut and sent
    /// with the full stop the sender erased: every later backspace one cluster behind. Before
    /// `unseen_joins` the space was taken with the mark and the text was "Hi". Three
    /// backspaces should leave "Hi" buffered and cut nothing.
    #[test]
    fn a_cluster_erase_takes_the_unseen_space_left_after_a_backspace_erased_the_one_after_it() {
        let mut ch = Pair::new(500);
        ch.cuts.erase_clusters(true);
        let cut = feed(&mut ch, "Hi.  \u{8}\u{301}\u{8}\u{8}");
        assert!(cut.is_empty(), "the erased full stop was sent: {cut:?}");
        assert_eq!(ch.ch.pending(), "Hi");
        assert_eq!(ch.ch.chars, 2);
    }

    #[test]
    fn white_space_only_is_never_a_chunk() {
        let mut ch = Pair::new(500);
        assert!(feed(&mut ch, "   \n  ").is_empty());
        assert_eq!(ch.ch.flush(FlushCause::End), None);
        assert!(feed(&mut ch, "ab\u{8}\u{8}").is_empty());
        assert_eq!(ch.ch.flush(FlushCause::Idle), None);
    }

    #[test]
    fn backspace_past_the_buffer_is_reported_as_erasing_sent_text() {
        let mut ch = Pair::new(500);
        ch.s().backspace();
        assert_eq!(ch.ch.take_erase_sent(), 1);
        feed(&mut ch, "x");
        ch.s().backspace();
        ch.s().backspace();
        assert_eq!(ch.ch.take_erase_sent(), 1);
        assert_eq!(ch.ch.take_erase_sent(), 0);
    }

    #[test]
    fn backspace_erases_the_space_that_ended_a_sentence_first() {
        let mut ch = Pair::new(500);
        // "Hi. " then two backspaces: the space, then the '.' of the chunk not yet handed out.
        let out = feed(&mut ch, "Hi. \u{8}\u{8}!");
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(ch.ch.pending(), "Hi!");
        // Backspacing over a whole ready chunk removes it.
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "Ok. \u{8}\u{8}\u{8}\u{8}No. ");
        assert_eq!(out, vec![("No.".into(), FlushCause::Sentence)]);
        assert_eq!(ch.ch.take_erase_sent(), 0);
    }

    /// The printable-ASCII fast path cuts exactly where a character at a time does.
    #[test]
    fn ascii_runs_cut_like_single_characters() {
        let texts = [
            "  Hello world.  How are you? Fine!Thanks. ",
            "no sentence end but a long line that must be cut by size somewhere",
            "a.b. c!  d?e ",
            "          ",
            "x",
        ];
        for max in [5, 12, 500] {
            for t in texts {
                let mut one = Pair::new(max);
                let mut run = Pair::new(max);
                let mut a = Vec::new();
                let mut b = Vec::new();
                // Split the run at every 7th byte, as packets would.
                for (i, piece) in t.as_bytes().chunks(7).enumerate() {
                    let piece = std::str::from_utf8(piece).unwrap();
                    for c in piece.chars() {
                        one.s().push_char(c);
                    }
                    run.s().push_ascii(piece.as_bytes());
                    a.extend(one.cuts.drain().map(|c| (c.text, c.cause)));
                    b.extend(run.cuts.drain().map(|c| (c.text, c.cause)));
                    assert_eq!(a, b, "max {max}, {t:?}, piece {i}");
                }
                a.extend(one.ch.flush(FlushCause::End).map(|c| (c.text, c.cause)));
                b.extend(run.ch.flush(FlushCause::End).map(|c| (c.text, c.cause)));
                assert_eq!(a, b, "max {max}, {t:?}");
            }
        }
    }

    /// The same on random text (words, runs of spaces, sentence ends, words longer than the
    /// size limit) split at random, comparing the whole state after every piece: the ASCII
    /// path must leave the counters, the last byte and the buffer as a character at a time
    /// does, which the chunks alone do not show (a white space left uncounted changes only
    /// what a later backspace erases). A piece may follow an ideographic sentence end or a
    /// no-break space, fed a character at a time to both: the ASCII path cuts a held end as
    /// the character path does.
    #[test]
    fn ascii_words_leave_the_state_single_characters_leave() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        const BYTES: &[u8] = b"abcdefghij    .!?,XYZ0123\")";
        for round in 0..400 {
            let max = [1, 2, 3, 7, 16, 64, 500][round % 7];
            let text: Vec<u8> = (0..next(120))
                .map(|_| BYTES[next(BYTES.len() as u64) as usize])
                .collect();
            let (mut one, mut run) = (Pair::new(max), Pair::new(max));
            let mut rest = &text[..];
            let shown = String::from_utf8_lossy(&text);
            while !rest.is_empty() {
                let (piece, after) = rest.split_at((1 + next(12) as usize).min(rest.len()));
                rest = after;
                if let Some(&c) = ['。', '！', '\u{a0}'].get(next(8) as usize) {
                    one.s().push_char(c);
                    run.s().push_char(c);
                }
                for &b in piece {
                    one.s().push_char(char::from(b));
                }
                run.s().push_ascii(piece);
                let cut = |p: &mut Pair| {
                    p.cuts
                        .drain()
                        .map(|c| (c.text, c.cause))
                        .collect::<Vec<_>>()
                };
                assert_eq!(cut(&mut one), cut(&mut run), "max {max}, {shown:?}");
                let state = |p: &Pair| {
                    (
                        p.ch.pending().to_owned(),
                        p.ch.chars,
                        p.ch.unseen_ws,
                        p.ch.tail,
                    )
                };
                assert_eq!(state(&one), state(&run), "max {max}, {shown:?}");
            }
        }
    }

    /// T.140 backspace erases the last character typed. After "Yes. I" the last three are
    /// "I", the space and "." : the space, cut with the sentence, is remembered while "I" is
    /// buffered, so the second backspace erases it and not the full stop already sent.
    #[test]
    fn backspace_erases_the_space_before_the_buffer_before_a_sent_chunk() {
        let mut ch = Pair::new(500);
        // Packet 1: the sentence is cut (and, in the gateway, sent at once).
        assert_eq!(
            feed(&mut ch, "Yes. I"),
            [("Yes.".into(), FlushCause::Sentence)]
        );
        // Packet 2: erase "I" and the space: the sent "Yes." is untouched.
        feed(&mut ch, "\u{8}\u{8}");
        assert_eq!(ch.ch.pending(), "");
        assert_eq!(
            ch.ch.take_erase_sent(),
            0,
            "the second backspace erased the space"
        );
    }

    /// The same within one packet, where the chunk is not handed out yet: "Hi. x" and two
    /// backspaces is "Hi.", so the chunk comes out whole, not reopened without its full stop.
    #[test]
    fn backspace_erases_the_space_before_the_buffer_before_a_ready_chunk() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "Hi. x\u{8}\u{8}");
        // "Hi. x" minus "x" and " " is "Hi.": nothing of "Hi." is erased.
        let mut seen: Vec<String> = out.into_iter().map(|c| c.0).collect();
        seen.extend(ch.ch.flush(FlushCause::End).map(|c| c.text));
        assert_eq!(seen.concat(), "Hi.");
    }

    /// A size cut drops the white space it splits at from both chunks; it was still typed, so
    /// a backspace past the next chunk's first word erases it (T.140), not the size chunk's
    /// last letter.
    #[test]
    fn backspace_after_a_size_cut_erases_the_white_space_cut_at() {
        let mut ch = Pair::new(10);
        assert_eq!(
            feed(&mut ch, "abc defgh ijk"),
            [("abc defgh".into(), FlushCause::Size)]
        );
        // Erase "ijk" and the space before it.
        feed(&mut ch, "\u{8}\u{8}\u{8}\u{8}");
        assert_eq!(ch.ch.pending(), "");
        assert_eq!(
            ch.ch.take_erase_sent(),
            0,
            "the fourth backspace erased the space"
        );
    }

    /// "？！" (and "。。。", the common CJK ellipsis) is one sentence end, as "?!" is: the second
    /// mark must not become a chunk of its own.
    #[test]
    fn ideographic_terminators_in_a_row_are_one_sentence_end() {
        let mut ch = Pair::new(500);
        let mut out = feed(&mut ch, "本当？！えっと。。。");
        out.extend(ch.ch.flush(FlushCause::End).map(|c| (c.text, c.cause)));
        let texts: Vec<&str> = out.iter().map(|c| c.0.as_str()).collect();
        assert!(
            !texts.iter().any(|t| matches!(*t, "！" | "。" | "。。")),
            "a lone punctuation chunk: {texts:?}"
        );
        // So at a size limit of one character the run is held past it, as a grapheme
        // cluster is, and cut whole before the next character.
        let mut ch = Pair::new(1);
        assert_eq!(feed(&mut ch, "。。"), []);
        assert_eq!(feed(&mut ch, "a"), [("。。".into(), FlushCause::Sentence)]);
        assert_eq!(ch.ch.pending(), "a");
    }

    /// A run of ideographic ends is one end when a mark extends its first (README, chunking:
    /// "a mark that extends it" goes with the end): at the size limit the held cut keeps
    /// "。\u{301}！" whole and it is cut as one sentence, as "。！" is and as it is under the
    /// limit. A review found the held cut asking only whether the buffer ended in an end, so
    /// "！" went out as a chunk of its own (review, session 35).
    #[test]
    fn a_held_size_cut_keeps_an_end_run_whole_when_a_mark_extends_its_first_end() {
        let mut ch = Pair::new(10);
        assert_eq!(
            feed(&mut ch, "abcdefghi。！x"),
            [("abcdefghi。！".to_owned(), FlushCause::Sentence)]
        );
        let mut ch = Pair::new(500);
        assert_eq!(
            feed(&mut ch, "abcdefghi。\u{301}！x"),
            [("abcdefghi。\u{301}！".to_owned(), FlushCause::Sentence)]
        );
        // At the limit: the end is the 10th character, the mark and `！` held past it.
        let mut ch = Pair::new(10);
        assert_eq!(
            feed(&mut ch, "abcdefghi。\u{301}！x"),
            [("abcdefghi。\u{301}！".to_owned(), FlushCause::Sentence)],
            "`。\\u{{301}}！` is one sentence end"
        );
        assert_eq!(ch.ch.pending(), "x");
    }

    /// A sentence end inside closing quotes or brackets (`"Stop." Then`, `(see above.)`,
    /// `“Really?” she`) ends the sentence at the white space after them, as `Stop. Then`
    /// does: the full stop is no longer the buffer's last character, and the sentence ran on
    /// into the next until the idle flush or the size limit. A review found it never cut
    /// (review c). A closing quote after no terminator (`"3.14" is`) still ends nothing.
    #[test]
    fn a_sentence_end_before_closing_quotes_ends_the_sentence() {
        let mut ch = Pair::new(500);
        let out = feed(
            &mut ch,
            "He said \"Stop.\" Then (see above.) She asked \u{201c}Really?\u{201d} Yes!') ok",
        );
        assert_eq!(
            out,
            [
                ("He said \"Stop.\"".into(), FlushCause::Sentence),
                ("Then (see above.)".into(), FlushCause::Sentence),
                (
                    "She asked \u{201c}Really?\u{201d}".into(),
                    FlushCause::Sentence
                ),
                ("Yes!')".into(), FlushCause::Sentence),
            ]
        );
        assert_eq!(ch.ch.pending(), "ok");
        // French guillemets, a no-break space inside them.
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "Il dit \u{ab}\u{a0}Bonjour.\u{a0}\u{bb} Puis");
        let want = "Il dit \u{ab}\u{a0}Bonjour.\u{a0}\u{bb}";
        assert_eq!(out, [(want.into(), FlushCause::Sentence)]);
        // The ASCII path cuts the same.
        let mut ch = Pair::new(500);
        ch.s().push_ascii(b"He said \"Stop.\"");
        ch.s().push_ascii(b" Then");
        let out: Vec<_> = ch.cuts.drain().map(|c| (c.text, c.cause)).collect();
        assert_eq!(out, [("He said \"Stop.\"".into(), FlushCause::Sentence)]);
        // No terminator inside the quotes: no sentence end.
        let mut ch = Pair::new(500);
        assert!(feed(&mut ch, "Pi is \"3.14\" and (x) 'y' \u{201d} z").is_empty());
        assert!(feed(&mut ch, "\" \u{2019} ").is_empty());
    }

    /// At the size limit with no white space to cut at, the closing quotes or brackets after a
    /// sentence end are held with it, as `？」` is, at most [`MAX_HELD`] characters: the cut
    /// fell between `.` and `"`, and the next chunk was a lone `"` (review g). A character at a
    /// time, and in an ASCII run, within it or across runs.
    #[test]
    fn a_closing_quote_at_the_size_limit_stays_with_its_sentence() {
        let want = [
            ("\"'Stop.'\"".into(), FlushCause::Sentence),
            ("Then".into(), FlushCause::Idle),
        ];
        for parts in [
            &["\"'Stop.'\" Then"][..],
            &["\"'Stop.", "'\" Then"],
            &["\"'Stop.'", "\"", " Then"],
        ] {
            for ascii in [false, true] {
                let mut ch = Pair::new(7);
                for p in parts {
                    match ascii {
                        true => ch.s().push_ascii(p.as_bytes()),
                        false => p.chars().for_each(|c| ch.s().push_char(c)),
                    }
                }
                let mut out: Vec<_> = ch.cuts.drain().map(|c| (c.text, c.cause)).collect();
                out.extend(ch.ch.flush(FlushCause::Idle).map(|c| (c.text, c.cause)));
                assert_eq!(out, want, "{parts:?} ascii {ascii}");
            }
        }
        // Other text after the quote is cut from it; a run of quotes is held at most so far.
        let mut ch = Pair::new(5);
        ch.s().push_ascii(b"Stop.\"x");
        let out: Vec<_> = ch.cuts.drain().map(|c| (c.text, c.cause)).collect();
        assert_eq!(out, [("Stop.\"".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "x");
        for ascii in [false, true] {
            let mut ch = Pair::new(5);
            let text = format!("Stop.{}", "\"".repeat(100));
            match ascii {
                true => ch.s().push_ascii(text.as_bytes()),
                false => text.chars().for_each(|c| ch.s().push_char(c)),
            }
            let first = ch.cuts.pop().map(|c| c.text.chars().count());
            assert_eq!(first, Some(5 + MAX_HELD as usize), "ascii {ascii}");
        }
    }

    /// A closing bracket or quote after an ideographic sentence end (`「本当？」と`, `“好。”他`)
    /// belongs to the sentence it closes: the end is held through it and cut before the next
    /// character, a character at a time, at the size limit, or before an ASCII run. A review
    /// found the end cut before the bracket, so the next chunk began with `」` (review c).
    #[test]
    fn a_closing_bracket_after_an_ideographic_end_goes_with_the_sentence() {
        let mut ch = Pair::new(500);
        let out = feed(
            &mut ch,
            "「本当？」と彼は言った。『はい。』』\u{201c}好。\u{201d}他",
        );
        assert_eq!(
            out,
            [
                ("「本当？」".into(), FlushCause::Sentence),
                ("と彼は言った。".into(), FlushCause::Sentence),
                ("『はい。』』".into(), FlushCause::Sentence),
                ("\u{201c}好。\u{201d}".into(), FlushCause::Sentence),
            ]
        );
        assert_eq!(ch.ch.pending(), "他");
        // Before an ASCII run.
        let mut ch = Pair::new(500);
        feed(&mut ch, "「はい。」");
        ch.s().push_ascii(b"OK");
        let out: Vec<_> = ch.cuts.drain().map(|c| c.text).collect();
        assert_eq!(out, ["「はい。」"]);
        assert_eq!(ch.ch.pending(), "OK");
        // At the size limit the bracket is held past it, as `？！` is.
        let mut ch = Pair::new(4);
        assert_eq!(
            feed(&mut ch, "「はい。」x"),
            [("「はい。」".into(), FlushCause::Sentence)]
        );
        assert_eq!(ch.ch.pending(), "x");
        // A bracket after no end is text as any other.
        let mut ch = Pair::new(500);
        assert!(feed(&mut ch, "「はい」と").is_empty());
    }

    /// A mark typed after the closing bracket of an ideographic sentence end (`？」\u{301}`)
    /// extends the bracket's cluster: the end is held through it (`extends_end`), but
    /// `held_end` then found no end in the last cluster, so the hold was dropped and the
    /// sentence was never cut; it ran on until the idle flush or the size limit (review g).
    /// Before the bracket was held, the cut fell before `」`.
    #[test]
    fn a_mark_after_a_closing_bracket_does_not_lose_the_sentence_end() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "「本当？」\u{301}と");
        assert_eq!(out, [("「本当？」\u{301}".into(), FlushCause::Sentence)]);
        assert_eq!(ch.ch.pending(), "と");
    }

    /// A no-break space exists to keep its neighbours together (Unicode class GL):
    /// "Dr.\u{a0}Who" is not a sentence end.
    #[test]
    fn no_break_space_after_an_abbreviation_does_not_end_a_sentence() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "Ask Dr.\u{a0}Who");
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(ch.ch.pending(), "Ask Dr.\u{a0}Who");
    }

    /// The same for a size cut: it splits at the last space, not at the no-break space after
    /// it, so "de\u{a0}fgh" stays together.
    #[test]
    fn no_break_space_is_not_where_a_size_cut_splits() {
        let mut ch = Pair::new(10);
        let out = feed(&mut ch, "abc de\u{a0}fghi");
        assert_eq!(out, [("abc".into(), FlushCause::Size)]);
        assert_eq!(ch.ch.pending(), "de\u{a0}fghi");
    }

    /// A reopened chunk brings back the white space typed before it: in "A. B. C" the fifth
    /// backspace erases the space after "A.", and "A." is cut whole.
    #[test]
    fn backspace_through_a_reopened_chunk_erases_the_space_before_it() {
        let mut ch = Pair::new(500);
        let out = feed(&mut ch, "A. B. C\u{8}\u{8}\u{8}\u{8}\u{8}");
        assert_eq!(out, [("A.".into(), FlushCause::Sentence)]);
        assert_eq!(ch.ch.pending(), "");
        assert_eq!(ch.ch.take_erase_sent(), 0);
    }
}
