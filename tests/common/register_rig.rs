//! A receive register (src/register.rs) driven by hand, its output as text: `~` a loss mark,
//! `|` a restart. Time passed as a value.
#![allow(dead_code)]

use pvp_t140::Time;
use pvp_t140::red::write_payload;
use pvp_t140::register::{Arrival, Outcome, Piece, Register};
use std::time::Duration;

pub const WAIT: Duration = Duration::from_millis(1000);

pub struct Rig {
    pub reg: Register,
    pub text: String,
}

impl Rig {
    pub fn new() -> Self {
        Rig {
            reg: Register::new(),
            text: String::new(),
        }
    }

    pub fn push(text: &mut String, p: Piece<'_>) {
        match p {
            Piece::Text(t) => text.push_str(std::str::from_utf8(t).unwrap()),
            Piece::Lost => text.push('~'),
            Piece::Packet { .. } => panic!("not by timestamp"),
            Piece::Restart => text.push('|'),
        }
    }

    pub fn raw(
        &mut self,
        ms: u64,
        seq: u16,
        ts: u32,
        marker: bool,
        red: bool,
        p: &[u8],
    ) -> Outcome {
        let a = Arrival {
            seq,
            ts,
            marker,
            red,
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

    /// RED packet stamped `ms`, generations oldest first 300 apart.
    pub fn red(&mut self, ms: u64, seq: u16, marker: bool, gens: &[&str], t: &str) -> Outcome {
        self.red_at(ms, seq, ms as u32, marker, gens, t)
    }

    /// A RED packet (RFC 2198) stamped `ts` with generations `gens`, oldest first, 300 ticks
    /// apart.
    pub fn red_at(
        &mut self,
        ms: u64,
        seq: u16,
        ts: u32,
        marker: bool,
        gens: &[&str],
        t: &str,
    ) -> Outcome {
        let n = gens.len() as u16;
        let blocks: Vec<(u16, &[u8])> = (gens.iter().enumerate())
            .map(|(i, g)| ((n - i as u16) * 300, g.as_bytes()))
            .collect();
        let mut p = Vec::new();
        write_payload(&mut p, 98, &blocks, t.as_bytes());
        self.raw(ms, seq, ts, marker, true, &p)
    }

    pub fn plain(&mut self, ms: u64, seq: u16, marker: bool, t: &str) -> Outcome {
        self.raw(ms, seq, ms as u32, marker, false, t.as_bytes())
    }

    /// What [`Rig::old_ten`] says.
    pub const OLD_TEN: &str = "o1.o2.o3.o4.o5.o6.o7.o8.o9.o10.";

    /// An old sequence: "o1." to "o10.", numbered 1001 to 1010, 300 ms and 300 ticks apart.
    pub fn old_ten(&mut self) {
        for s in 1..=10u16 {
            let t = format!("o{s}.");
            let at = u64::from(s) * 300;
            self.raw(
                at,
                1000 + s,
                u32::from(s) * 300,
                s == 1,
                false,
                t.as_bytes(),
            );
        }
    }

    /// [`Rig::restart_from`] 3.5 s.
    pub fn restart(&mut self, base: u16, ts: u32, order: &[usize], expire: bool) {
        self.restart_from(3500, base, ts, order, expire);
    }

    /// A restart's packets `i` in `order`, numbered `base + i`, saying "n{i}." (n0 marked and
    /// after a BOM: a session's start), 300 ms apart from `from` ms and stamped `ts + 300 i`;
    /// with `expire`, the register's wait runs before each.
    pub fn restart_from(&mut self, from: u64, base: u16, ts: u32, order: &[usize], expire: bool) {
        for (k, &i) in order.iter().enumerate() {
            let at = from + k as u64 * 300;
            if expire {
                self.expire(at);
            }
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
                false,
                t.as_bytes(),
            );
        }
    }

    pub fn expire(&mut self, ms: u64) {
        let text = &mut self.text;
        self.reg
            .expire(Time::from_millis(ms), WAIT, &mut |_, p| Self::push(text, p));
    }
}
