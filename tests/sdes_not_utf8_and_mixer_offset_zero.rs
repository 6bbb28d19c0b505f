//! The packet parse path against its normative texts, through the sans-IO core: RTCP SDES
//! items that are not UTF-8 (RFC 3550 6.5) are counted, not dropped unseen (one cut at its
//! 255-octet bound inside a character is read up to the cut); an RFC 9071
//! mixer's RED generations at timestamp offset 0 (RFC 2198) recover a source's lost packet
//! however the stream's losses were accounted (RFC 4103 4.2).
//!
//! Found by review am (session 45).

use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// One SDES packet (RFC 3550 6.5) for `ssrc` with the items `(type, octets)` as given.
fn sdes(ssrc: u32, items: &[(u8, &[u8])]) -> Vec<u8> {
    let mut d = vec![0x81, 202, 0, 0];
    d.extend_from_slice(&ssrc.to_be_bytes());
    for (kind, text) in items {
        d.push(*kind);
        d.push(text.len() as u8);
        d.extend_from_slice(text);
    }
    d.push(0);
    while d.len() % 4 != 0 {
        d.push(0);
    }
    let words = (d.len() / 4 - 1) as u16;
    d[2..4].copy_from_slice(&words.to_be_bytes());
    d
}

/// RFC 3550 6.5: SDES text is UTF-8. A NAME in Latin-1 ("Adé" as 0x41 0x64 0xE9, what a
/// sender that does not encode its user's name sends) cannot be shown as sent, and is passed
/// over for the CNAME, as before; but it was passed over without a trace, so an operator
/// asking why a participant shows as "ada@host" instead of her name had nothing to go on. It
/// is counted now (`sdes_not_utf8`, `pvp_t140_sdes_items_not_utf8_total`), once however many
/// receive workers act on the datagram (only the one that counts it).
#[test]
fn an_sdes_name_that_is_not_utf8_is_counted_and_the_cname_names_the_speaker() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, ""));
    let latin1 = sdes(7, &[(1, b"ada@host"), (2, b"Ad\xe9")]);
    gw.handle_datagram(at(10), addr(4000), &latin1);
    gw.handle_datagram(at(20), addr(4000), &t140(2, 7, "Hello. "));
    let s = gw.stats();
    assert_eq!((s.sdes_not_utf8, s.drops_total()), (1, 0));
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    assert_eq!(join.payload["participant"]["name"], "ada@host");
    // A CNAME that is not UTF-8 either, in a compound with a valid NAME: counted as well.
    let cname = sdes(7, &[(1, b"\xffada"), (2, b"Ada")]);
    gw.handle_datagram(at(30), addr(4000), &cname);
    assert_eq!(gw.stats().sdes_not_utf8, 2);
    // Items the gateway reads nothing from (EMAIL, NOTE) are not its to judge.
    gw.handle_datagram(at(40), addr(4000), &sdes(7, &[(3, b"\xff"), (7, b"\xfe")]));
    assert_eq!(gw.stats().sdes_not_utf8, 2);
    // From the RTCP port: the worker that counts the datagram counts the item, the others
    // acting on it for their streams do not.
    gw.handle_rtcp_port(at(50), addr(4001), &latin1, None, false);
    assert_eq!(gw.stats().sdes_not_utf8, 2);
    gw.handle_rtcp_port(at(60), addr(4001), &latin1, None, true);
    assert_eq!(gw.stats().sdes_not_utf8, 3);
    assert_eq!(gw.stats().drops_total(), 0);
}

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// An RFC 9071 mixer's stream of two sources, A (CSRC 1) and B (CSRC 2), each packet carrying
/// its source's two previous packets as RED generations at timestamp offset 0 (RFC 2198 allows
/// it; Asterisk writes it), so placed by content ([`pvp_t140`]'s speaker lines them up with
/// the source's last packet). B's 5 is lost; A's 6 accounts for none of it. A's 7 and B's 8
/// are lost too; B's 9 carries B's 5 and 8 (its two generations, both new), and with one
/// loss left unaccounted the gateway marks one on B as text of B's that may be missing (its
/// rule for a speaker whose every generation is new). A's 10 then carries A's 7 ("three ")
/// after the "two " A last said: that is A's lost packet, lined up by content, but no loss
/// was left unaccounted for the stream, so the generation was taken for a repeat and "three"
/// vanished from A's transcript, neither recovered nor marked nor counted. With timestamp
/// offsets the same packets recover it. Now a generation lined up after the speaker's last
/// text is its lost packet's whatever the stream's count says, as with offsets.
#[test]
fn a_mixer_sources_zero_offset_generation_after_its_last_text_is_recovered() {
    let run = |offsets: bool| {
        let a = ["Alpha ", "one ", "two ", "three ", "four. "];
        let b = ["Bravo ", "uno ", "dos ", "tres ", "cuatro. "];
        // (sequence, source, index of its text), in sending order.
        let plan = [
            (1u16, 1u32, 0usize),
            (2, 2, 0),
            (3, 1, 1),
            (4, 2, 1),
            (5, 2, 2),
            (6, 1, 2),
            (7, 1, 3),
            (8, 2, 3),
            (9, 2, 4),
            (10, 1, 4),
        ];
        let lost = [5, 7, 8];
        let mut gw = Gateway::new(Config::default());
        let mut stamps: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        for (seq, csrc, i) in plan {
            let texts = if csrc == 1 { &a } else { &b };
            let ts = 1000 + 150 * u32::from(seq);
            let own = &mut stamps[csrc as usize - 1];
            own.push(ts);
            let back_by = |back: usize| match i.checked_sub(back) {
                Some(j) => (
                    if offsets { (ts - own[j]) as u16 } else { 0 },
                    texts[j].as_bytes(),
                ),
                None => (0, &b""[..]),
            };
            let gens = [back_by(2), back_by(1)];
            let d = red_csrc_m(seq == 1, seq, ts, csrc, &gens, texts[i].as_bytes());
            if lost.contains(&seq) {
                continue;
            }
            let t = 150 * u64::from(seq);
            run_timers(&mut gw, t);
            gw.handle_datagram(at(t), addr(5000), &d);
        }
        run_timers(&mut gw, 60_000);
        gw.shutdown(at(61_000));
        let out = drain(&mut gw);
        (text_of(&out, "csrc:00000001"), gw.stats().recovered)
    };
    let (with_offsets, recovered) = run(true);
    assert_eq!(with_offsets, "Alpha one two three four.", "the reference");
    assert_eq!(run(false), (with_offsets, recovered), "offsets of 0");
}

/// The same mixer, generations at offset 0: B's 2 and A's 3 (A's first packet) are lost. A's 4
/// carries A's 3 and, before it, an empty generation: A had said nothing before (a session's
/// first packets carry empty generations), so it stands for no packet. It was counted as one of
/// A's lost packets all the same, taking B's lost 2 for A's; B's 7 then placed its 2 ("uno ")
/// against one of A's later losses (5 and 6), and A's 8, carrying both, found one loss left
/// for two generations that line up with nothing A said: A's "two three" vanished, unmarked
/// and uncounted. With timestamp offsets (the empty generations stamped too) nothing is lost.
#[test]
fn a_new_mixer_sources_empty_first_generations_take_no_other_sources_loss() {
    let run = |offsets: bool| {
        let a = ["Alpha ", "one ", "two ", "three ", "four. "];
        let b = ["Bravo ", "uno ", "dos "];
        // (sequence, source, index of its text), in sending order.
        let plan = [
            (1u16, 2u32, 0usize),
            (2, 2, 1),
            (3, 1, 0),
            (4, 1, 1),
            (5, 1, 2),
            (6, 1, 3),
            (7, 2, 2),
            (8, 1, 4),
        ];
        let lost = [2, 3, 5, 6];
        let mut gw = Gateway::new(Config::default());
        let mut stamps: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        for (seq, csrc, i) in plan {
            let texts: &[&str] = if csrc == 1 { &a } else { &b };
            let ts = 1000 + 150 * u32::from(seq);
            let own = &mut stamps[csrc as usize - 1];
            own.push(ts);
            let back_by = |back: usize| match i.checked_sub(back) {
                Some(j) => (
                    if offsets { (ts - own[j]) as u16 } else { 0 },
                    texts[j].as_bytes(),
                ),
                None => (if offsets { 150 * back as u16 } else { 0 }, &b""[..]),
            };
            let gens = [back_by(2), back_by(1)];
            let d = red_csrc_m(seq == 1, seq, ts, csrc, &gens, texts[i].as_bytes());
            if lost.contains(&seq) {
                continue;
            }
            let t = 150 * u64::from(seq);
            run_timers(&mut gw, t);
            gw.handle_datagram(at(t), addr(5000), &d);
        }
        run_timers(&mut gw, 60_000);
        gw.shutdown(at(61_000));
        let out = drain(&mut gw);
        (
            text_of(&out, "csrc:00000001"),
            text_of(&out, "csrc:00000002"),
        )
    };
    let with_offsets = run(true);
    assert_eq!(
        with_offsets,
        ("Alpha one two three four.".into(), "Bravo uno dos".into()),
        "the reference"
    );
    assert_eq!(run(false), with_offsets, "offsets of 0");
}

/// An SDES item holds at most 255 octets (RFC 3550 6.5); a sender that cuts a longer name by
/// octets, not characters, ends it inside one. "José " and 125 "é" is 256 octets in UTF-8:
/// cut at 255, the last "é" is half there. The whole NAME was taken for not UTF-8 and passed
/// over for the CNAME ("jose@host"), though every character before the cut is whole. It is
/// read up to the cut now, and counted as not UTF-8 all the same (the sender's fault); an
/// item cut short of the bound, or broken inside, is still passed over.
#[test]
fn an_sdes_name_cut_inside_a_character_at_255_octets_is_read_up_to_the_cut() {
    let long = format!("José {}", "é".repeat(125));
    assert_eq!(long.len(), 256);
    let cut = &long.as_bytes()[..255];
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, ""));
    gw.handle_datagram(at(10), addr(4000), &sdes(7, &[(1, b"jose@host"), (2, cut)]));
    gw.handle_datagram(at(20), addr(4000), &t140(2, 7, "Hello. "));
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    let name = join.payload["participant"]["name"].as_str().unwrap();
    assert!(name.starts_with("José é"), "{name}");
    assert_eq!(gw.stats().sdes_not_utf8, 1);
    // Cut short of the bound, or broken inside: passed over for the CNAME.
    for bad in [&cut[..253], &[b'J', 0xff, b'o'][..]] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(at(0), addr(4000), &t140(1, 7, ""));
        gw.handle_datagram(at(10), addr(4000), &sdes(7, &[(1, b"jose@host"), (2, bad)]));
        gw.handle_datagram(at(20), addr(4000), &t140(2, 7, "Hello. "));
        let out = drain(&mut gw);
        let join = out.iter().find(|e| e.kind == "session.join").unwrap();
        assert_eq!(join.payload["participant"]["name"], "jose@host");
        assert_eq!(gw.stats().sdes_not_utf8, 1);
    }
}

/// Known gap, confirmed: the same mixer, generations at offset 0. B's 5 is lost; A's 6 accounts
/// for none of it. A's 7 and 8 and B's 9 are lost; A's 10 carries A's 7 and 8, both new, and
/// with two losses still unaccounted the gateway marks one on A as older text of A's that may
/// be missing (its rule for a speaker whose every generation is new; with timestamp offsets
/// too). B's 11 then carries B's 5 and 9, both new, but lined up with nothing B said (its
/// every generation new) it finds only one loss left for two generations, and they are taken
/// for repeats: "dos tres" vanish from B's transcript, unmarked and uncounted. With timestamp
/// offsets they are recovered. Taking every generation as new past the stream's count would
/// fix it, but a mixer whose redundancy is the mixed stream's (other sources' text) would then
/// have it said again as B's: the gap is left open.
#[test]
#[ignore = "known gap: a mixer source's every generation at offset 0 new, past the stream's unaccounted losses another source's mark took, is taken for a repeat (its text lost unmarked)"]
fn a_mixer_sources_zero_offset_generations_past_another_sources_mark_are_recovered() {
    let run = |offsets: bool| {
        let a = ["Alpha ", "one ", "two ", "three ", "four ", "five. "];
        let b = ["Bravo ", "uno ", "dos ", "tres ", "cuatro. "];
        let plan = [
            (1u16, 2u32, 0usize),
            (2, 1, 0),
            (3, 1, 1),
            (4, 2, 1),
            (5, 2, 2),
            (6, 1, 2),
            (7, 1, 3),
            (8, 1, 4),
            (9, 2, 3),
            (10, 1, 5),
            (11, 2, 4),
        ];
        let lost = [5, 7, 8, 9];
        let mut gw = Gateway::new(Config::default());
        let mut stamps: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        for (seq, csrc, i) in plan {
            let texts: &[&str] = if csrc == 1 { &a } else { &b };
            let ts = 1000 + 150 * u32::from(seq);
            let own = &mut stamps[csrc as usize - 1];
            own.push(ts);
            let back_by = |back: usize| match i.checked_sub(back) {
                Some(j) => (
                    if offsets { (ts - own[j]) as u16 } else { 0 },
                    texts[j].as_bytes(),
                ),
                None => (if offsets { 150 * back as u16 } else { 0 }, &b""[..]),
            };
            let gens = [back_by(2), back_by(1)];
            let d = red_csrc_m(seq == 1, seq, ts, csrc, &gens, texts[i].as_bytes());
            if lost.contains(&seq) {
                continue;
            }
            let t = 150 * u64::from(seq);
            run_timers(&mut gw, t);
            gw.handle_datagram(at(t), addr(5000), &d);
        }
        run_timers(&mut gw, 60_000);
        gw.shutdown(at(61_000));
        text_of(&drain(&mut gw), "csrc:00000002")
    };
    assert_eq!(run(true), "Bravo uno dos tres cuatro.", "the reference");
    assert_eq!(run(false), run(true), "offsets of 0");
}
