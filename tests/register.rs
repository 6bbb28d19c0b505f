//! The receive register through its public API (`pvp_t140::register`), with explicit times:
//! what its unit tests in src/register.rs cannot show from outside, here the hold bound
//! (MAX_HELD) meeting the fill from a later held RED packet (README "Reordering").

use pvp_t140::Time;
use pvp_t140::red::write_payload;
use pvp_t140::register::{Arrival, MAX_HELD, Outcome, Piece, Register};

/// Runs packets through a register and renders what comes out: text, and `~` per loss mark.
struct Rig {
    reg: Register,
    text: String,
}

impl Rig {
    fn new() -> Self {
        Rig {
            reg: Register::new(),
            text: String::new(),
        }
    }

    fn push(text: &mut String, p: Piece<'_>) {
        match p {
            Piece::Text(t) => text.push_str(std::str::from_utf8(t).unwrap()),
            Piece::Lost => text.push('~'),
            Piece::Packet { .. } => panic!("no packet is placed by timestamp here"),
            Piece::Restart => {}
        }
    }

    fn arrival(seq: u16, marker: bool, red: bool, payload: &[u8]) -> Arrival<'_> {
        Arrival {
            seq,
            ts: 0,
            marker,
            red,
            tag: 0,
            by_ts: false,
            at: Time::default(),
            payload,
            parsed: None,
        }
    }

    fn raw(&mut self, ms: u64, seq: u16, marker: bool, red: bool, payload: &[u8]) -> Outcome {
        let a = Arrival {
            at: Time::from_millis(ms),
            ..Self::arrival(seq, marker, red, payload)
        };
        let text = &mut self.text;
        self.reg
            .receive(Time::from_millis(ms), a, &mut |_, p| Self::push(text, p))
            .unwrap()
    }

    /// RED packet `seq` with primary `t` and redundancy `gens` (oldest first, RFC 2198).
    fn red(&mut self, ms: u64, seq: u16, marker: bool, gens: &[&str], t: &str) -> Outcome {
        let p = red_payload(gens, t);
        self.raw(ms, seq, marker, true, &p)
    }
}

/// An RFC 2198 payload: `gens` oldest first, 300 ms apart, then the primary.
fn red_payload(gens: &[&str], t: &str) -> Vec<u8> {
    let n = gens.len() as u16;
    let blocks: Vec<(u16, &[u8])> = (gens.iter().enumerate())
        .map(|(i, g)| ((n - i as u16) * 300, g.as_bytes()))
        .collect();
    let mut p = Vec::new();
    write_payload(&mut p, 98, &blocks, t.as_bytes());
    p
}

// ---------------------------------------------------------------------------------------------
// The hold bound (MAX_HELD) and the fill from a later packet.
// ---------------------------------------------------------------------------------------------

/// README "Reordering": "a packet ahead of a gap waits ... unless a later RED packet's redundancy
/// fills the gap at once ... At most 64 packets wait a stream; past that the oldest gap is given
/// up at once (after placing the new packet, which may be the one that fills it)."
///
/// 1 "a" (two generations, so the stream's reach is 2), 2 "b" lost, 3 "c" sent without
/// generations (a burst start, RFC 4103 5.2) held, then 63 packets 5..=67 held behind it (no
/// generations: none of them reaches back to 2). 64 held. Then 4 ["b", "c"] "d" arrives: its
/// first generation is 2's text, and with fewer packets held it fills the gap at once
/// (`fill_from_later`), and at the bound too: the oldest gap is given up only after the new
/// packet has drained what it closes. A review found it given up first (by 3's own
/// redundancy) and 2 marked lost though the packet that just came carried it (review,
/// session 35).
#[test]
fn at_the_hold_bound_a_later_red_packet_that_fills_the_oldest_gap_still_fills_it() {
    // Below the bound the fill works: the control.
    let mut few = Rig::new();
    few.red(0, 1, true, &["", ""], "a");
    assert_eq!(few.red(10, 3, false, &[], "c"), Outcome::Held);
    assert_eq!(few.red(20, 5, false, &[], "e"), Outcome::Held);
    assert_eq!(few.red(30, 4, false, &["b", "c"], "d"), Outcome::Delivered);
    assert_eq!(few.text, "abcde");

    let mut r = Rig::new();
    r.red(0, 1, true, &["", ""], "a");
    assert_eq!(r.red(10, 3, false, &[], "c"), Outcome::Held);
    let mut want = String::from("abcd");
    for seq in 5..=67u16 {
        let t = format!("<{seq}>");
        assert_eq!(
            r.red(10 + u64::from(seq), seq, false, &[], &t),
            Outcome::Held
        );
        want.push_str(&t);
    }
    assert_eq!(r.reg.held(), MAX_HELD);
    assert_eq!(r.red(100, 4, false, &["b", "c"], "d"), Outcome::Delivered);
    assert_eq!(r.reg.held(), 0);
    assert_eq!(
        r.text, want,
        "2's text came with 4, the packet that made the 65th"
    );
    let s = r.reg.stats();
    assert_eq!((s.recovered, s.lost), (1, 0));
}

/// The same at the bound with the first held packet marked (a burst start, RFC 4103 5.2): the
/// gap in front of it given up is presumed the idle tail, so 2's text, which the packet that
/// made the 65th carries, would be dropped without a mark and counted `idle_tail`; it is
/// filled from 4, as below the bound (the control). Found by the same review (review, session
/// 35).
#[test]
fn at_the_hold_bound_text_a_later_red_packet_carries_is_not_taken_for_an_idle_tail() {
    let mut few = Rig::new();
    few.red(0, 1, true, &["", ""], "a");
    assert_eq!(few.red(10, 3, true, &[], "c"), Outcome::Held);
    assert_eq!(few.red(30, 4, false, &["b", "c"], "d"), Outcome::Delivered);
    assert_eq!(few.text, "abcd");

    let mut r = Rig::new();
    r.red(0, 1, true, &["", ""], "a");
    assert_eq!(r.red(10, 3, true, &[], "c"), Outcome::Held);
    for seq in 5..=67u16 {
        r.red(10 + u64::from(seq), seq, false, &[], "");
    }
    assert_eq!(r.reg.held(), MAX_HELD);
    assert_eq!(r.red(100, 4, false, &["b", "c"], "d"), Outcome::Delivered);
    let s = r.reg.stats();
    assert_eq!(
        (r.text.as_str(), s.recovered, s.idle_tail, s.lost),
        ("abcd", 1, 0, 0),
        "2's text came with 4"
    );
}
