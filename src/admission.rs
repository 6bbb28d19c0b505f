//! Who may send: source allow-list (`--allow CIDR`) and a per-source packet-rate limit, checked
//! before a datagram is parsed. Sans-IO, fixed memory: the rate table is a fixed array of token
//! buckets indexed by a keyed hash of the source address, so a flood from many addresses cannot
//! grow it (colliding sources share a budget, which only makes the limit stricter for them).

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;

use ipnet::IpNet;

use crate::time::Time;

const BUCKETS: usize = 4096;

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Tokens in millionths of a packet: a microsecond's refill (`pps` of them) is exact, so a
    /// source sending faster than a packet a microsecond still gets its `pps`.
    micro: u64,
    last: Time,
}

/// Why admission refused a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotAllowed,
    RateLimited,
}

#[derive(Debug)]
pub struct Admission {
    allow: Vec<IpNet>,
    /// Packets per second per source; 0 = no limit.
    pps: u64,
    buckets: Box<[Bucket]>,
    hasher: crate::stream::KeyHasher,
}

impl Admission {
    pub fn new(allow: Vec<IpNet>, pps: u32) -> Self {
        Admission {
            allow,
            pps: u64::from(pps),
            buckets: if pps == 0 {
                Box::new([])
            } else {
                // Full from the start: a source's first second is its burst whatever the
                // clock says (a capture replayed from the epoch, `Time(0)`, got no refill).
                let full = Bucket {
                    micro: u64::from(pps) * 1_000_000,
                    last: Time(0),
                };
                vec![full; BUCKETS].into_boxed_slice()
            },
            hasher: Default::default(),
        }
    }

    /// Whether `src` is in an allow-list network. Out of line: only with an allow list. An IPv4
    /// sender to a dual-stack listener is checked by its IPv4 address
    /// ([`crate::stream::canonical`]).
    #[inline(never)]
    fn allowed(&self, src: SocketAddr) -> bool {
        let ip = crate::stream::canonical(src).ip();
        self.allow.iter().any(|n| n.contains(&ip))
    }

    /// Admits or refuses one datagram from `src` at `now`.
    #[inline(always)]
    pub fn admit(&mut self, now: Time, src: SocketAddr) -> Result<(), Refusal> {
        if !self.allow.is_empty() && !self.allowed(src) {
            return Err(Refusal::NotAllowed);
        }
        if self.pps == 0 {
            return Ok(());
        }
        let mut h = self.hasher.build_hasher();
        let ip = match src.ip() {
            std::net::IpAddr::V4(a) => u128::from(a.to_bits()),
            std::net::IpAddr::V6(a) => a.to_bits(),
        };
        h.write_u128(ip ^ u128::from(src.port()) << 96);
        let b = &mut self.buckets[h.finish() as usize % BUCKETS];
        // Refill: pps tokens a second, at most one second's worth (the allowed burst).
        // A second fills any bucket, so a longer wait (a new bucket's `last` is the epoch) is
        // clamped to one: with the rate a u32, no product then overflows (1e6 us * 2^32 <
        // 2^64), where decades of microseconds times a rate above about 10,500 did.
        let cap = self.pps * 1_000_000;
        let elapsed_us = now.0.saturating_sub(b.last.0).min(1_000_000);
        b.micro = (b.micro + elapsed_us * self.pps).min(cap);
        b.last = now;
        if b.micro < 1_000_000 {
            return Err(Refusal::RateLimited);
        }
        b.micro -= 1_000_000;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_and_rate_limit() {
        let mut a = Admission::new(
            vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            0,
        );
        assert_eq!(a.admit(Time(0), "10.1.2.3:5".parse().unwrap()), Ok(()));
        assert_eq!(a.admit(Time(0), "[::1]:5".parse().unwrap()), Ok(()));
        assert_eq!(
            a.admit(Time(0), "11.0.0.1:5".parse().unwrap()),
            Err(Refusal::NotAllowed)
        );

        let mut a = Admission::new(vec![], 10);
        let src: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let t0 = Time::from_millis(1_000_000);
        // A fresh bucket starts full (a second's burst).
        let admitted = (0..50).filter(|_| a.admit(t0, src).is_ok()).count();
        assert_eq!(admitted, 10);
        // Half a second later: five more.
        let t1 = Time::from_millis(1_000_500);
        assert_eq!((0..50).filter(|_| a.admit(t1, src).is_ok()).count(), 5);
        // Another source has its own budget.
        assert!(a.admit(t1, "192.0.2.2:4000".parse().unwrap()).is_ok());
    }

    /// A high rate: a new bucket (last refilled at the epoch) multiplied decades of
    /// microseconds by the rate, which overflowed above about 10,500 a second (a panic in a
    /// debug build, a wrapped count in release).
    /// A source sending more than a thousand times its rate (here 1,000,000 packets a second
    /// against 10) still gets its 10 a second: the refill of each microsecond was rounded down
    /// to nothing, so after its first second's burst it was refused for good.
    #[test]
    fn a_flood_far_over_the_rate_still_gets_the_rate() {
        let mut a = Admission::new(vec![], 10);
        let src: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let t0 = Time::from_millis(1_000_000).0;
        let admitted = (0..=2_000_000u64)
            .filter(|us| a.admit(Time(t0 + us), src).is_ok())
            .count();
        assert_eq!(
            admitted,
            10 + 20,
            "a second's burst, then 10 a second for 2 s"
        );
    }

    /// A capture stamped from the epoch (relative times, or shifted to 0) replays with the
    /// clock near `Time(0)`: a new bucket refilled from `last = Time(0)` got nothing, so a
    /// source's first packets were refused as over its rate.
    #[test]
    fn a_new_source_at_the_epoch_gets_its_burst() {
        let mut a = Admission::new(vec![], 10);
        let src: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let admitted = (0..50).filter(|_| a.admit(Time(0), src).is_ok()).count();
        assert_eq!(admitted, 10);
        assert_eq!(
            a.admit(Time(100_000), src),
            Ok(()),
            "a tenth of a second: one more"
        );
        assert!(a.admit(Time(100_000), src).is_err());
    }

    #[test]
    fn a_high_rate_neither_overflows_nor_refuses_the_first_datagram() {
        let now = Time(1_764_000_000_000_000);
        for pps in [20_000, 10_000_000, u32::MAX] {
            let mut a = Admission::new(Vec::new(), pps);
            assert_eq!(a.admit(now, "10.1.2.3:5".parse().unwrap()), Ok(()), "{pps}");
        }
        // The limit still holds: 20,000 a second is a burst of 20,000, then refusals.
        let mut a = Admission::new(Vec::new(), 20_000);
        let src = "10.1.2.3:5".parse().unwrap();
        let admitted = (0..30_000).filter(|_| a.admit(now, src).is_ok()).count();
        assert_eq!(admitted, 20_000);
    }
}
