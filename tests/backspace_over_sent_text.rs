//! T.140 backspace (U+0008: erase the last character typed) reaching text the gateway already
//! sent, driven through the sans-IO gateway: the correction (pvp-spec 9.3 `context.update`)
//! must erase exactly what the speaker erased, white space included.

use std::time::Duration;

use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// "Yes. I", then three backspaces (erasing "I", the space, the ".") and "! ": the speaker's
/// text is "Yes!". The space after the sent "Yes." is remembered while "I" is buffered, so
/// only the third backspace reaches the sent item, and takes its "." alone.
#[test]
fn backspace_over_the_space_after_a_sent_sentence_erases_the_space() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Yes. I"));
    gw.handle_datagram(at(300), addr(4000), &t140(2, 7, "\u{8}\u{8}\u{8}! "));
    let out = drain(&mut gw);
    assert_eq!(shown(&out), ["Yes", "!"]);
}

/// Sent "Hello world" (idle flush). Five backspaces erase "world": the update shows "Hello",
/// trimmed, but the space stays in what the gateway remembers was typed, so the sixth
/// backspace erases the space (no update) and not the "o".
#[test]
fn a_correction_trims_what_it_sends_and_keeps_the_space_for_the_next_backspace() {
    let mut gw = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello world"));
    gw.handle_timeout(at(500));
    gw.handle_datagram(
        at(1000),
        addr(4000),
        &t140(2, 7, "\u{8}\u{8}\u{8}\u{8}\u{8}"),
    );
    gw.handle_datagram(at(1300), addr(4000), &t140(3, 7, "\u{8}"));
    let out = drain(&mut gw);
    // Six backspaces typed after "Hello world" leave "Hello", corrected once: erasing the
    // space changes nothing shown.
    assert_eq!(shown(&out), ["Hello"]);
    let updates = out.iter().filter(|e| e.kind == "context.update").count();
    assert_eq!(updates, 1);
}

/// README (Text decoding): backspaces correct the speaker's last item; reaching past it into
/// earlier ones they are counted, not applied. Two sentences sent, then backspaces erasing
/// everything typed: the last item is removed, the first stays, and the backspaces past the
/// last item (the space before it and "Hello.", seven) are counted as unmatched erasures.
#[test]
fn erasing_past_the_last_item_is_counted_not_applied() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. World. "));
    // "Hello. World. " is 14 characters: 14 backspaces erase all of it.
    gw.handle_datagram(at(300), addr(4000), &t140(2, 7, &"\u{8}".repeat(14)));
    gw.handle_timeout(at(5000));
    let out = drain(&mut gw);
    let adds = out.iter().filter(|e| e.kind == "context.add").count();
    assert_eq!(adds, 2, "both sentences were sent: {out:?}");
    assert!(out.iter().any(|e| e.kind == "context.remove"), "{out:?}");
    assert_eq!(shown(&out), ["Hello."]);
    assert_eq!(gw.stats().erase_unmatched, "Hello. ".len() as u64);
}

/// A backspace that finds nothing to erase in the text not yet sent (nothing buffered, no
/// chunk to reopen) counts in `pvp_t140_backspace_unmatched_total` (README "Metrics"; its
/// help text says so), as well as in `_erase_unmatched_total` when no item is there to
/// correct. A stream whose first text is two backspaces counts both in each. A review found
/// the gateway's chunker answered every backspace as matched, so the first never moved
/// (review, session 33).
#[test]
fn backspaces_with_nothing_to_erase_are_counted_as_backspace_unmatched() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "\u{8}\u{8}Hi. "));
    let out = drain(&mut gw);
    assert!(out.iter().any(|e| e.kind == "context.add"), "{out:?}");
    assert_eq!(
        gw.stats().erase_unmatched,
        2,
        "the gateway saw them as unmatched"
    );
    assert_eq!(gw.stats().decode.backspace_unmatched, 2);
}

/// README (Receiving, RTCP): a mixer's source's BYE ends that speaker ("it leaves"), and "a
/// packet of it stamped later than that is said after the BYE: it joins again" (a new
/// participation; t140.rs `Decoder::finish`: "its next session's text must not be read as the
/// old one's escape sequence"). README (Text decoding): a backspace corrects "the speaker's
/// last item". Source B said "Bravo. " and left; it comes back and its first text is two
/// backspaces (they erase nothing of the new participation). The gateway keeps B's chunker
/// and its memory of the last item across the BYE: the first backspace erases the space after
/// "Bravo." that the old participation typed, the second reaches the item of the ended
/// participation and edits it (`context.update` "Bravo"), after B left and joined again.
#[test]
fn a_mixer_source_back_after_its_bye_does_not_erase_its_old_participations_text() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    gw.handle_timeout(at(2000));
    // B again, in a new participation: "\b\b", then "Back. ".
    gw.handle_datagram(
        at(3000),
        addr(5000),
        &with_csrc(3, 4000, 9, 2, b"\x08\x08Back. "),
    );
    gw.handle_timeout(at(6000));
    let out = drain(&mut gw);
    // B's envelopes in order, as (kind, content or new_content).
    let b: Vec<(String, String)> = out
        .iter()
        .filter(|e| e.sender.ends_with("csrc:00000002"))
        .map(|e| {
            let c = e.payload["content"]
                .as_str()
                .or(e.payload["new_content"].as_str())
                .unwrap_or("");
            (e.kind.clone(), c.to_owned())
        })
        .collect();
    assert_eq!(
        b,
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "Back."),
        ]
    );
    assert_eq!(shown(&out), ["Alpha.", "Bravo.", "Back."]);
    assert_eq!(
        gw.stats().erase_unmatched,
        2,
        "erasing nothing of the new participation"
    );
}
