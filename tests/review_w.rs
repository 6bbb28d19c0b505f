//! Review w: a second look at the register's sequence-restart rules (src/register.rs
//! `Register::jump`), driven through the public API with time passed as a value.

use pvp_t140::Time;
use pvp_t140::register::{Arrival, Outcome, Piece, Register};
use std::time::Duration;

const WAIT: Duration = Duration::from_millis(1000);

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
            Piece::Packet { .. } => panic!("not by timestamp"),
            Piece::Restart => text.push('|'),
        }
    }

    fn raw(&mut self, ms: u64, seq: u16, ts: u32, marker: bool, p: &[u8]) -> Outcome {
        let a = Arrival {
            seq,
            ts,
            marker,
            red: false,
            tag: 0,
            by_ts: false,
            at: Time::from_millis(ms),
            payload: p,
            parsed: None,
        };
        let text = &mut self.text;
        self.reg
            .receive(Time::from_millis(ms), a, &mut |_, p| Self::push(text, p))
            .unwrap()
    }

    const OLD_TEN: &str = "o1.o2.o3.o4.o5.o6.o7.o8.o9.o10.";

    /// An old sequence: "o1." to "o10.", numbered 1001 to 1010, 300 ms and 300 ticks apart.
    fn old_ten(&mut self) {
        for s in 1..=10u16 {
            let t = format!("o{s}.");
            let at = u64::from(s) * 300;
            self.raw(at, 1000 + s, u32::from(s) * 300, s == 1, t.as_bytes());
        }
    }

    /// A restart's packets `i` in `order`, numbered `base + i`, saying "n{i}." (n0 marked and
    /// after a BOM), 300 ms apart from `from` ms and stamped `ts + 300 i`.
    fn restart(&mut self, from: u64, base: u16, ts: u32, order: &[usize]) {
        for (k, &i) in order.iter().enumerate() {
            let at = from + k as u64 * 300;
            self.expire(at);
            let t = match i {
                0 => "\u{feff}n0.".to_string(),
                _ => format!("n{i}."),
            };
            let seq = base.wrapping_add(i as u16);
            self.raw(
                at,
                seq,
                ts.wrapping_add(i as u32 * 300),
                i == 0,
                t.as_bytes(),
            );
        }
    }

    fn expire(&mut self, ms: u64) {
        let text = &mut self.text;
        self.reg
            .expire(Time::from_millis(ms), WAIT, &mut |_, p| Self::push(text, p));
    }
}

/// The kept jump packets are "in arrival order" ([`Register`]'s `run`), and a run completed
/// out of order with the kept full is believed only when its last-come packet is later than
/// the first kept. Letting a stray go by `swap_remove` moved the newest kept to the front:
/// a stray (far off) kept, then a restart 200 back arriving n0 n2 n4 n1 n3 n5: n1 let the stray
/// go and put n4 first, so n3 (before n4) confirmed nothing, and the farthest from it, the
/// run's marked first packet n0, was let go. Stamped behind, the rest was then taken for late
/// copies and dropped (nothing of the new session said); stamped ahead, n0's text was lost
/// without a mark.
#[test]
fn a_stray_let_go_keeps_the_kept_in_arrival_order() {
    for ts_new in [20u32, 500_000] {
        let mut r = Rig::new();
        r.old_ten();
        assert_eq!(r.raw(3_400, 30_000, 77, false, b"X"), Outcome::Jump);
        let base = 1011u16 - 200;
        r.restart(3_500, base, ts_new, &[0, 2, 4, 1, 3, 5]);
        r.expire(100_000);
        let old = Rig::OLD_TEN;
        assert_eq!(
            r.text,
            format!("{old}|\u{feff}n0.n1.n2.n3.n4.n5."),
            "stamped from {ts_new}"
        );
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 1, 0, 0));
    }
}

/// A restart 200 back (three in a row believe it) stamped behind the old clock (a new random
/// clock, RFC 3550 5.1), plain T.140, its third packet lost: n0 (marked, BOM), n1, n3, n4, n5.
/// n0 is kept before the run n3..=n5 and taken as the restart's (it starts a session); n1,
/// between n0 and the run and stamped between them, was let go as a stray (neither marked nor
/// stamped after the old sequence's last), and its text, received, marked lost with n2's.
#[test]
fn a_packet_between_a_restarts_kept_start_and_its_run_is_the_restarts() {
    let mut r = Rig::new();
    r.old_ten();
    let base = 1011u16 - 200;
    r.restart(3_500, base, 20, &[0, 1, 3, 4, 5]);
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(r.text, format!("{old}|\u{feff}n0.n1.~n3.n4.n5."));
    let s = r.reg.stats();
    assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 1));
}
