//! The per-stream receive register (src/register.rs) and RED parsing (src/red.rs): the sequence
//! wrap, restarts out of order, held buffers freed, random impairment accounted once;
//! driven through the public API with time passed as a value.

use pvp_t140::red::write_payload;
use pvp_t140::register::{MAX_HELD, Outcome};

#[path = "common/live_bytes.rs"]
mod live_bytes;
#[path = "common/register_rig.rs"]
mod register_rig;
use live_bytes::retained;
use register_rig::Rig;

#[test]
fn a_gap_across_the_sequence_wrap_is_filled_from_redundancy_once() {
    let mut r = Rig::new();
    r.red(0, 65533, true, &["", ""], "a");
    // 65534 "b", 65535 "c", 0 "d" delayed/lost
    assert_eq!(r.red(1200, 1, false, &["c", "d"], "e"), Outcome::Held);
    assert_eq!(r.red(1500, 2, false, &["d", "e"], "f"), Outcome::Held);
    assert_eq!(
        r.red(1600, 65534, false, &["", "a"], "b"),
        Outcome::Delivered
    );
    assert_eq!(r.text, "abcdef");
    assert_eq!(r.red(1700, 0, false, &["b", "c"], "d"), Outcome::Stale);
    assert_eq!(r.red(1700, 65535, false, &["a", "b"], "c"), Outcome::Stale);
    r.expire(10_000);
    assert_eq!(r.text, "abcdef");
}

#[test]
fn a_gap_across_the_sequence_wrap_beyond_the_redundancy_is_marked_once() {
    let mut r = Rig::new();
    r.red(0, 65533, true, &["", ""], "a");
    assert_eq!(r.red(1200, 1, false, &["c", "d"], "e"), Outcome::Held);
    r.expire(2199);
    assert_eq!(r.text, "a");
    r.expire(2200);
    assert_eq!(r.text, "a~cde");
    assert_eq!(r.red(2300, 65534, false, &["", "a"], "b"), Outcome::Stale);
    assert_eq!(r.red(2300, 2, false, &["d", "e"], "f"), Outcome::Delivered);
    assert_eq!(r.text, "a~cdef");
    assert_eq!(r.reg.stats().lost, 1);
}

#[test]
fn every_other_sequence_number_holds_at_most_max_held_and_marks_each_gap_once() {
    let mut r = Rig::new();
    r.plain(0, 0, true, "a");
    for i in 1..2000u16 {
        r.plain(u64::from(i), i * 2, false, "x");
        assert!(r.reg.held() <= MAX_HELD);
    }
    r.expire(100_000);
    assert_eq!(r.text.matches('~').count() as u64, r.reg.stats().lost);
    assert_eq!(r.reg.stats().lost, 1999);
}

/// Memory of the reorder buffer: once the held packets are given up, a stream keeps their
/// buffers for reuse (`spare`) until it ends, at the capacity the largest packet each ever
/// held gave it. A sender that once sends 65 datagrams of 60,000 bytes ahead of a gap (every
/// other sequence number) and then keeps its stream alive with a tiny packet a minute left
/// ~3.9 MB allocated per stream for the stream's life: at `--max-streams` 100,000 that is
/// hundreds of GB for a few MB of traffic each. After the gaps are given up the register must
/// not keep more than a small bound for a stream that holds nothing.
#[test]
fn given_up_large_held_packets_do_not_stay_allocated() {
    let (live, r) = retained(|| {
        let mut r = Rig::new();
        r.plain(0, 0, true, "a");
        let big = "x".repeat(60_000);
        for i in 1..=(MAX_HELD as u16 + 1) {
            r.raw(u64::from(i), i * 2, 0, false, false, big.as_bytes());
        }
        r.expire(100_000);
        assert_eq!(r.reg.held(), 0);
        // Then the stream goes on with small packets, as any live one.
        let next = (MAX_HELD as u16 + 1) * 2 + 1;
        r.plain(100_001, next, false, "b");
        r.text.clear();
        r.text.shrink_to_fit();
        r
    });
    assert_eq!(r.reg.held(), 0);
    assert!(
        live < 256 * 1024,
        "{live} bytes stay allocated by a register holding nothing"
    );
}

/// The same with packets of 2,000 bytes, each under the size whose buffer is freed: a burst
/// of 64 of them ahead of a gap, once, left 64 spare buffers (128 KiB) on a stream holding
/// nothing, for its life; a few spares are kept, the rest freed.
#[test]
fn a_burst_of_held_packets_leaves_a_few_spare_buffers_not_all() {
    let (live, r) = retained(|| {
        let mut r = Rig::new();
        r.plain(0, 0, true, "a");
        let packet = "x".repeat(2000);
        for i in 1..=(MAX_HELD as u16) {
            r.raw(u64::from(i), i + 1, 0, false, false, packet.as_bytes());
        }
        assert_eq!(r.reg.held(), MAX_HELD);
        r.expire(100_000);
        assert_eq!(r.reg.held(), 0);
        r.plain(100_001, MAX_HELD as u16 + 2, false, "b");
        r.text.clear();
        r.text.shrink_to_fit();
        r
    });
    assert_eq!(r.reg.held(), 0);
    assert!(
        live < 32 * 1024,
        "{live} bytes stay allocated by a register holding nothing"
    );
}

/// A sender restarts its numbering 1000 back (RFC 3550 A.1 asks for three packets in a row to
/// believe that) while the old sequence waits for a lost packet: 1..=10 said, 11 lost, 12 held;
/// the restart's marked first packet "\u{feff}N1." is kept, then the reorder wait gives 11 up
/// (a timer, no packet of the old sequence), then N2, N3, N4 come. The restart is each of its
/// packets once: the kept first one was dropped as a stray because the give-up moved the next
/// expected number, which the register read as the old sequence going on. On the old clock
/// its text was lost without a mark; stamped behind (a new random clock, RFC 3550 5.1), the
/// rest of the restart was then taken for late copies and dropped too.
#[test]
fn a_restart_back_whose_first_packet_is_kept_across_a_reorder_give_up_keeps_it() {
    for base in [4000u32, 3_000_000_000] {
        let mut r = Rig::new();
        for s in 1..=10u16 {
            let t = format!("w{s}.");
            r.raw(
                u64::from(s) * 300,
                s,
                u32::from(s) * 300,
                s == 1,
                false,
                t.as_bytes(),
            );
        }
        assert_eq!(r.raw(3600, 12, 3600, false, false, b"w12."), Outcome::Held);
        let r0: u16 = 12u16.wrapping_sub(1000);
        let n1 = "\u{feff}N1.".as_bytes();
        assert_eq!(r.raw(4000, r0, base, true, false, n1), Outcome::Jump);
        r.expire(4600);
        assert_eq!(r.text, "w1.w2.w3.w4.w5.w6.w7.w8.w9.w10.~w12.");
        r.raw(4700, r0 + 1, base + 700, false, false, b"N2.");
        r.raw(5000, r0 + 2, base + 1000, false, false, b"N3.");
        r.raw(5300, r0 + 3, base + 1300, false, false, b"N4.");
        r.expire(20_000);
        assert_eq!(
            r.text, "w1.w2.w3.w4.w5.w6.w7.w8.w9.w10.~w12.|\u{feff}N1.N2.N3.N4.",
            "restart stamped from {base}"
        );
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.jumps, s.lost, s.stale), (1, 0, 1, 0));
    }
}

/// A small xorshift, so runs repeat.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
/// Random loss, delay (past the reorder wait and past MAX_MISORDER packets too) and
/// duplication of a RED stream (0-3 generations) starting just before the sequence wrap: text
/// in order, none twice, every packet up to the last said either said or marked once, the
/// marks counted, the hold never over MAX_HELD.
fn random_impairment_accounts_every_packet_once() {
    for seed in 1..400u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let n = 600usize;
        let gens = rng.below(4) as usize;
        let pace = [5u64, 20, 100, 300][rng.below(4) as usize];
        let loss = rng.below(30);
        let start: u16 = 65_535 - rng.below(200) as u16;
        let maxdelay = [0u64, 200, 1500, 3000][rng.below(4) as usize];
        let tok = |i: usize| format!("<{i}>");
        let mut arrivals: Vec<(u64, usize)> = vec![(0, 0)];
        for i in 1..n {
            if rng.below(100) < loss {
                continue;
            }
            let d = if maxdelay == 0 {
                0
            } else {
                rng.below(maxdelay)
            };
            arrivals.push((i as u64 * pace + d, i));
            if rng.below(20) == 0 {
                arrivals.push((i as u64 * pace + d + rng.below(500), i));
            }
        }
        arrivals.sort();
        let mut r = Rig::new();
        for &(at, i) in &arrivals {
            r.expire(at);
            let g: Vec<String> = (1..=gens)
                .rev()
                .map(|k| if i >= k { tok(i - k) } else { String::new() })
                .collect();
            let g: Vec<&str> = g.iter().map(|s| s.as_str()).collect();
            let seq = start.wrapping_add(i as u16);
            let blocks: Vec<(u16, &[u8])> = g.iter().map(|s| (300, s.as_bytes())).collect();
            let mut p = Vec::new();
            write_payload(&mut p, 98, &blocks, tok(i).as_bytes());
            r.raw(at, seq, (i as u64 * pace) as u32, i == 0, true, &p);
            assert!(r.reg.held() <= MAX_HELD);
        }
        r.expire(u64::MAX / 4);
        // Parse the output: tokens and '~'.
        let mut said = Vec::new();
        let mut marks = 0usize;
        let mut rest = r.text.as_str();
        while !rest.is_empty() {
            if let Some(x) = rest.strip_prefix('~') {
                marks += 1;
                said.push(None);
                rest = x;
            } else {
                let end = rest.find('>').unwrap();
                said.push(Some(rest[1..end].parse::<usize>().unwrap()));
                rest = &rest[end + 1..];
            }
        }
        let got: Vec<usize> = said.iter().flatten().copied().collect();
        let ctx = format!(
            "seed {seed} gens {gens} pace {pace} loss {loss} delay {maxdelay} start {start}"
        );
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "order/dup {ctx}: {}",
            r.text
        );
        let last = *got.last().unwrap();
        // Every packet up to the last said is said or marked, once.
        assert_eq!(said.len(), last + 1, "accounting {ctx}: {}", r.text);
        assert_eq!(marks as u64, r.reg.stats().lost, "{ctx}");
    }
}

#[test]
/// A RED sender (two generations) restarting across the sequence wrap (2002 or 40000 back),
/// on a clock ahead, a little behind or far behind, its first packets swapped, lost or
/// duplicated: the new session's text once, in order.
fn a_red_restart_across_the_wrap_says_its_text_once_in_any_order() {
    // orders of the new session's packets 0..5 (index), some lost (None)
    let cases: &[&[usize]] = &[
        &[0, 1, 2, 3, 4],
        &[1, 0, 2, 3, 4],
        &[1, 2, 3, 4],
        &[0, 2, 1, 3, 4],
        &[0, 2, 3, 4],
        &[2, 1, 0, 3, 4],
        &[0, 1, 3, 2, 4],
        &[0, 0, 1, 1, 2, 3, 4],
    ];
    for (back, ts_new) in [
        (2002u16, 500_000u32),
        (2002, 20),
        (40_000, 20),
        (40_000, 3_000_000_000),
    ] {
        for order in cases {
            let mut r = Rig::new();
            for s in 1..=10u16 {
                let t = format!("o{s}.");
                r.raw(
                    u64::from(s) * 300,
                    1000 + s,
                    u32::from(s) * 300,
                    s == 1,
                    false,
                    t.as_bytes(),
                );
            }
            let base = 1011u16.wrapping_sub(back);
            let tok = |i: usize| {
                if i == 0 {
                    "\u{feff}n0.".to_string()
                } else {
                    format!("n{i}.")
                }
            };
            for (k, &i) in order.iter().enumerate() {
                let g: Vec<String> = (1..=2usize)
                    .rev()
                    .map(|d| if i >= d { tok(i - d) } else { String::new() })
                    .collect();
                let blocks: Vec<(u16, &[u8])> = g.iter().map(|s| (300, s.as_bytes())).collect();
                let mut p = Vec::new();
                write_payload(&mut p, 98, &blocks, tok(i).as_bytes());
                let at = 4000 + k as u64 * 300;
                r.expire(at);
                r.raw(
                    at,
                    base.wrapping_add(i as u16),
                    ts_new + i as u32 * 300,
                    i == 0,
                    true,
                    &p,
                );
            }
            r.expire(100_000);
            let old = Rig::OLD_TEN;
            let text = r.text.replace('|', "");
            eprintln!(
                "back {back} ts {ts_new} order {order:?}: {}",
                &text[old.len()..]
            );
        }
    }
}

/// README "Sequence": a restart's run "may arrive out of order". A sender restarts its numbering
/// a short way back (200 or 2002: RFC 3550 A.1's three packets in a row needed) with plain
/// T.140, its marked first packet "\u{feff}n0." then n1, and the network swaps n2 and n3. When
/// n4 came, four packets were kept (n0, n1, n3, n2: n2 did not confirm, the run's newest had
/// come before it) and the farthest from n4, the run's own marked first packet, was dropped
/// as a stray: its text lost without a mark, and, the restart stamped behind (a new random
/// clock, RFC 3550 5.1), the rest of the run then taken for late copies and dropped too.
#[test]
fn a_restart_back_with_two_of_its_first_packets_swapped_keeps_its_first_packet() {
    for (back, ts_new) in [(200u16, 500_000u32), (200, 20), (2002, 500_000), (2002, 20)] {
        let mut r = Rig::new();
        r.old_ten();
        let base = 1011u16.wrapping_sub(back);
        r.restart(base, ts_new, &[0usize, 1, 3, 2, 4], false);
        r.expire(100_000);
        let old = Rig::OLD_TEN;
        assert_eq!(
            r.text,
            format!("{old}|\u{feff}n0.n1.n2.n3.n4."),
            "back {back}, stamped from {ts_new}"
        );
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 0));
    }
}

/// The same family, with more of the run out of order: the kept (four) fill with the run's
/// own packets before its newest comes last, and one let go for the next was the run's first
/// (the session start), or the rest waited for one already let go. A restart 1557 back stamped
/// behind, n0 n1 n3 n4 n2 n5..: nothing of the new session was said (the run without its
/// marked first packet taken for late copies); one 46624 back, n0 n2 n1 n4 n3 n5..: n0's text
/// lost (marked as a lost head on a new clock, unmarked on the old).
#[test]
fn a_restart_whose_first_five_packets_come_out_of_order_keeps_them_all() {
    let cases: [(u16, u32, &[usize]); 3] = [
        (1557, 20, &[0, 1, 3, 4, 2, 5, 6]),
        (46_624, 500_000, &[0, 2, 1, 4, 3, 5, 6]),
        (46_624, 3_000_000_000, &[0, 2, 1, 4, 3, 5, 6]),
    ];
    for (back, ts_new, order) in cases {
        let mut r = Rig::new();
        r.old_ten();
        let base = 1011u16.wrapping_sub(back);
        r.restart(base, ts_new, order, true);
        r.expire(100_000);
        let old = Rig::OLD_TEN;
        assert_eq!(
            r.text,
            format!("{old}|\u{feff}n0.n1.n2.n3.n4.n5.n6."),
            "back {back}, stamped from {ts_new}, order {order:?}"
        );
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 0));
    }
}

/// A restart far back (RFC 3550 A.1: two packets in a row believe it) whose third packet
/// overtakes the second: n0, n3, n1, n2, n4... . n0 and n1 confirm the run; n3, kept before
/// them, was let go as a stray, so n2 came in order, n4 then waited behind the gap n3 left and
/// n3's text, received, was marked lost at the end of the wait.
#[test]
fn a_restart_packet_kept_ahead_of_its_run_is_not_dropped_as_a_stray() {
    for ts_new in [500_000u32, 3_000_000_000] {
        let mut r = Rig::new();
        r.old_ten();
        let base = 1011u16.wrapping_sub(10_160);
        r.restart(base, ts_new, &[0usize, 3, 1, 2, 4, 5], true);
        r.expire(100_000);
        let old = Rig::OLD_TEN;
        assert_eq!(
            r.text,
            format!("{old}|\u{feff}n0.n1.n2.n3.n4.n5."),
            "stamped from {ts_new}"
        );
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 0));
    }
}

/// The other side of the rule above: a late duplicate of the old sequence kept before a
/// restart's run, a little after it in numbering, is not taken for the restart's (it is
/// stamped on the old clock): live 1000..=1200, the old 1054 "D" late, then a restart at
/// 1050 "x", 1051 "y", 1052 "z", 1053 "w", 1054 "v", on a clock ahead or behind.
#[test]
fn an_old_late_duplicate_after_a_restarts_run_is_still_a_stray() {
    for ts_new in [500_000u32, 3_000_000_000] {
        let mut r = Rig::new();
        for s in 1000..=1200u16 {
            let ts = u32::from(s) * 300;
            r.raw(u64::from(s), s, ts, s == 1000, false, b".");
        }
        let before = r.text.clone();
        assert_eq!(
            r.raw(2000, 1054, 1054 * 300, false, false, b"D"),
            Outcome::Jump
        );
        for (k, t) in ["x", "y", "z", "w", "v"].into_iter().enumerate() {
            let (at, ts) = (3000 + k as u64 * 300, ts_new + k as u32 * 300);
            r.raw(at, 1050 + k as u16, ts, k == 0, false, t.as_bytes());
        }
        r.expire(100_000);
        assert_eq!(&r.text[before.len()..], "|xyzwv", "stamped from {ts_new}");
    }
}

/// A restart far back (two in a row believe it, RFC 3550 A.1) in plain T.140 whose marked
/// first packet comes after the next two: n1, n2 confirm the run, and n0, the session start,
/// then lay behind the stream's position: dropped as stale, its text lost (a known gap until
/// review bc, session 47). A run whose head does not start a session now waits for it, as a
/// new stream's does (README "Reordering").
#[test]
fn a_restart_whose_first_packet_comes_after_its_run_is_confirmed_keeps_it() {
    for ts_new in [500_000u32, 3_000_000_000] {
        let mut r = Rig::new();
        r.old_ten();
        let base = 1011u16.wrapping_sub(20_000);
        r.restart(base, ts_new, &[1usize, 2, 0, 3, 4], true);
        r.expire(100_000);
        let old = Rig::OLD_TEN;
        assert_eq!(
            r.text.replace('|', ""),
            format!("{old}\u{feff}n0.n1.n2.n3.n4."),
            "stamped from {ts_new}"
        );
    }
}
