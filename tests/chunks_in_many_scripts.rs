//! Found by review ag (session 43): chunking of speech-to-text output in many scripts (other
//! scripts' sentence ends, direction marks and variation selectors after an end, German and
//! French closing quotes, invisible-only items, a half-width bracket after a CJK end, a
//! conjunct split by an idle flush), through the sans-IO core with time as a value.

use std::time::Duration;

use pvp_t140::{Config, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

fn gw(max: usize) -> Gateway {
    Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        max_chunk_chars: max,
        ..Config::default()
    })
}

fn packet(seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(&mut d, seq == 1, 98, seq, u32::from(seq) * 300, 7, payload);
    d
}

/// Packets 50 ms apart (no idle flush between), then the stream's end; every item as shown.
fn say(max: usize, packets: &[&str]) -> Vec<String> {
    let mut g = gw(max);
    let mut ms = 0;
    let mut out = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        g.handle_datagram(at(ms), addr(4000), &packet(i as u16 + 1, p.as_bytes()));
        ms += 50;
        g.handle_timeout(at(ms));
        out.extend(drain(&mut g));
    }
    g.shutdown(at(ms + 100_000));
    out.extend(drain(&mut g));
    shown(&out)
}

/// Packets with the time (ms) since the one before, each after the idle flushes due; every
/// item as shown.
fn say_at(packets: &[(u64, &str)]) -> Vec<String> {
    let mut g = gw(500);
    let mut ms = 0;
    let mut out = Vec::new();
    for (i, (gap, p)) in packets.iter().enumerate() {
        ms += gap;
        g.handle_timeout(at(ms));
        g.handle_datagram(at(ms), addr(4000), &packet(i as u16 + 1, p.as_bytes()));
        out.extend(drain(&mut g));
    }
    g.shutdown(at(ms + 100_000));
    out.extend(drain(&mut g));
    shown(&out)
}

/// A sentence ends at the terminators of other scripts as at `.`, `!` or `?`, once white space
/// follows: Arabic `؟`, Urdu `۔`, Devanagari `।` and `॥`, Armenian `։`, Ethiopic `።` and `፧`,
/// Myanmar `။`, Khmer `។`, `‼` and `⁉`. They ended nothing, so a Hindi or Urdu caption ran
/// every sentence into the next until a pause or the size limit. Decimals and words are still
/// not cut where no white space follows.
#[test]
fn sentence_terminators_of_other_scripts_end_a_sentence() {
    for (text, want) in [
        ("هل أنت بخير؟ نعم", &["هل أنت بخير؟", "نعم"][..]),
        ("یہ اردو ہے۔ دوسرا", &["یہ اردو ہے۔", "دوسرا"]),
        (
            "यह हिंदी है। दूसरा वाक्य॥ तीसरा",
            &["यह हिंदी है।", "दूसरा वाक्य॥", "तीसरा"],
        ),
        ("Սա հայերեն է։ Երկրորդ", &["Սա հայերեն է։", "Երկրորդ"]),
        ("ይህ አማርኛ ነው። ምን፧ ሁለተኛ", &["ይህ አማርኛ ነው።", "ምን፧", "ሁለተኛ"]),
        ("ဟုတ်ကဲ့။ နောက်", &["ဟုတ်ကဲ့။", "နောက်"]),
        ("បាទ។ បន្ទាប់", &["បាទ។", "បន្ទាប់"]),
        ("What‼ Really⁉ Yes", &["What‼", "Really⁉", "Yes"]),
        // Closing quotes after it, as after `.`.
        ("قال «هل أنت بخير؟» ثم", &["قال «هل أنت بخير؟»", "ثم"]),
    ] {
        assert_eq!(say(500, &[text]), want, "{text:?}");
        let words: Vec<String> = text.split_inclusive(' ').map(str::to_owned).collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        assert_eq!(say(500, &words), want, "{text:?} a word a packet");
    }
    // The space alone in a packet (the decoder's ASCII path).
    assert_eq!(
        say(500, &["یہ اردو ہے۔", " ", "دوسرا"]),
        ["یہ اردو ہے۔", "دوسرا"]
    );
    // No white space after it: no cut (full-width decimals, CJK text).
    assert_eq!(say(500, &["３．１４です"]), ["３．１４です"]);
}

/// A right-to-left or left-to-right mark (U+200F, U+200E, U+061C) put after a sentence's full
/// stop, as RTL text mixed with LTR often has to keep the stop on the right side, is invisible
/// and ends nothing by itself: the sentence still ends at the white space after it. It ran
/// into the next.
#[test]
fn a_bidi_mark_after_a_sentence_end_does_not_hide_it() {
    for mark in ['\u{200f}', '\u{200e}', '\u{61c}'] {
        let text = format!("مرحبا.{mark} كيف حالك؟{mark} Fine!{mark} next");
        let want = [
            format!("مرحبا.{mark}"),
            format!("كيف حالك؟{mark}"),
            format!("Fine!{mark}"),
            "next".to_owned(),
        ];
        assert_eq!(say(500, &[&text]), want, "{text:?}");
    }
    // Inside closing quotes too.
    assert_eq!(
        say(500, &["قال «نعم.»\u{200f} ثم"]),
        ["قال «نعم.»\u{200f}", "ثم"]
    );
    // A mark after a word is no sentence end.
    assert_eq!(say(500, &["abc\u{200f} def"]), ["abc\u{200f} def"]);
}

/// A chunk of nothing but invisible characters (Unicode Default_Ignorable_Code_Point: a
/// zero-width space or joiner, a direction mark, a word joiner, a soft hyphen, a variation
/// selector, the Hangul filler) is as blank to a reader as white space, which is never sent;
/// typed after a sentence's end and left by a pause or the stream's end, it was sent as an
/// item showing nothing. Before text, it stays with the text.
#[test]
fn a_chunk_of_invisible_characters_only_is_not_sent() {
    for inv in [
        "\u{200f}",
        "\u{200b}",
        "\u{2060}",
        "\u{fe0f}",
        "\u{200d}",
        "\u{ad}",
        "\u{3164}",
        "\u{200b} \u{200e}\n",
    ] {
        let text = format!("Hi. {inv}");
        // Left by the stream's end, and by a pause.
        assert_eq!(say(500, &[&text]), ["Hi."], "{text:?}");
        assert_eq!(say_at(&[(0, &text), (1000, "")]), ["Hi."], "{text:?}");
        // Before text, it goes with the text.
        let more = format!("{inv}x");
        assert_eq!(say(500, &[&text, "x"]), ["Hi.", &more], "{text:?}");
    }
}

/// German, Czech, Lithuanian and other typographies close a quotation with `“` (U+201C),
/// `‘` (U+2018), `«` or `‹` (»Stopp.« in German books): after a sentence end, these close it
/// as `”` does, and the sentence ends at the white space after them. `„Stopp.“ Dann` ran into
/// the next sentence.
#[test]
fn closing_quotes_of_other_typographies_keep_the_sentence_end() {
    for (text, first) in [
        ("Er sagte „Stopp.“ Dann", "Er sagte „Stopp.“"),
        ("Er sagte ‚Ja!‘ Dann", "Er sagte ‚Ja!‘"),
        ("Er sagte »Stopp.« Dann", "Er sagte »Stopp.«"),
        ("Er sagte ›Ja?‹ Dann", "Er sagte ›Ja?‹"),
        ("Řekl „Ano.“ Pak", "Řekl „Ano.“"),
    ] {
        let rest = text.rsplit(' ').next().unwrap();
        assert_eq!(say(500, &[text]), [first, rest], "{text:?}");
    }
}

/// `‼` and `⁉` are usually typed as emoji, with the presentation selector U+FE0F after them
/// (`‼️`): the selector only picks the glyph, and the sentence still ends at the white space
/// after it, as after a bare `‼`.
#[test]
fn an_emoji_presentation_selector_after_a_sentence_end_does_not_hide_it() {
    assert_eq!(
        say(500, &["Wow‼\u{fe0f} Really⁉\u{fe0f} Yes!\u{fe0f} ok"]),
        ["Wow‼\u{fe0f}", "Really⁉\u{fe0f}", "Yes!\u{fe0f}", "ok"]
    );
}

/// A half-width `)` or `]` right after an ideographic sentence end closes it (`他说(好。)然后`),
/// as the full-width `）` does: it goes with the sentence. The end was cut before it, so the
/// next chunk began with a lone `)`. Typed a character at a time, in one packet, or with
/// ASCII after it.
#[test]
fn a_half_width_bracket_after_an_ideographic_end_goes_with_the_sentence() {
    assert_eq!(say(500, &["他说(好。)然后"]), ["他说(好。)", "然后"]);
    assert_eq!(say(500, &["他说[好。]]然后"]), ["他说[好。]]", "然后"]);
    assert_eq!(say(500, &["他说(好。) then"]), ["他说(好。)", "then"]);
    assert_eq!(say(500, &["他说(好。)ok"]), ["他说(好。)", "ok"]);
    assert_eq!(
        say(500, &["他说(好。", ")", "然后"]),
        ["他说(好。)", "然后"]
    );
    assert_eq!(say(500, &["他说(好。", ")ok"]), ["他说(好。)", "ok"]);
    // An opening bracket after the end starts the next sentence.
    assert_eq!(say(500, &["そうですね。(笑)"]), ["そうですね。", "(笑)"]);
}

/// A backspace after a sentence cut at one of these ends erases the white space after it, then
/// the end itself in the item sent (context.update), as after `.`: the counts of what the cut
/// kept out of the chunk hold for every script.
#[test]
fn backspaces_across_a_sentence_cut_at_another_scripts_end_correct_the_item() {
    for (text, next, erase, left) in [
        ("यह है। ", "", 2, "यह है"),
        ("هل أنت بخير؟\u{200f} ", "", 3, "هل أنت بخير"),
        ("Er sagte „Stopp.“ ", "", 2, "Er sagte „Stopp."),
        // Cut before the next character, which the first backspace erases.
        ("他说(好。)", "x", 3, "他说(好"),
    ] {
        let bs = "\u{8}".repeat(erase);
        let shown = say_at(&[(0, text), (50, next), (50, &bs)]);
        assert_eq!(shown, [left], "{text:?}");
    }
}

/// With t140llm's cluster erase, a pause that lets the idle flush fall inside an Indic
/// conjunct (`क्` sent, `ष` after it: one grapheme cluster, UAX #29 GB9c) leaves the
/// backspace that erases the cluster to erase `क्` in the item sent too, as it does when
/// the pause falls before a vowel sign.
#[test]
fn a_cluster_erase_across_an_idle_flush_inside_a_conjunct_erases_its_first_half() {
    let mut g = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        compat: pvp_t140::Compat::T140llm,
        ..Config::default()
    });
    let mut out = Vec::new();
    for (i, (ms, p)) in [(0, "अक्"), (1000, "ष"), (1100, "\u{8}")]
        .into_iter()
        .enumerate()
    {
        g.handle_timeout(at(ms));
        g.handle_datagram(at(ms), addr(4000), &packet(i as u16 + 1, p.as_bytes()));
        out.extend(drain(&mut g));
    }
    g.shutdown(at(100_000));
    out.extend(drain(&mut g));
    assert_eq!(shown(&out), ["अ"]);
}

/// The same for a flag an idle flush split between its two regional indicators (`🇯` sent,
/// `🇵` after it: one cluster, UAX #29 GB12): the sender's backspace erases the flag, the
/// chunker only the `🇵` it holds, so the item keeps a lone `🇯`.
#[test]
#[ignore = "known gap: a cluster erase goes on into the chunk cut before only for a mark, a \
            joiner or a conjunct's consonant; a flag's second half (or a Hangul jamo) would need \
            the cut chunk's last cluster kept, which the speaker's hot part has no room for"]
fn a_cluster_erase_across_an_idle_flush_inside_a_flag_erases_its_first_half() {
    let mut g = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        compat: pvp_t140::Compat::T140llm,
        ..Config::default()
    });
    let mut out = Vec::new();
    for (i, (ms, p)) in [(0, "ok 🇯"), (1000, "🇵"), (1100, "\u{8}")]
        .into_iter()
        .enumerate()
    {
        g.handle_timeout(at(ms));
        g.handle_datagram(at(ms), addr(4000), &packet(i as u16 + 1, p.as_bytes()));
        out.extend(drain(&mut g));
    }
    g.shutdown(at(100_000));
    out.extend(drain(&mut g));
    assert_eq!(shown(&out), ["ok"]);
}
