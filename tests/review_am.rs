//! The packet parse path against its normative texts, through the sans-IO core: RTCP SDES
//! items that are not UTF-8 (RFC 3550 6.5) are counted, not dropped unseen.
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
