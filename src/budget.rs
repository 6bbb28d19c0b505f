//! The stream limit (`--max-streams`) of the whole gateway. With `--workers N` each receive
//! worker has a core of its own, and a bound checked per core let the gateway take N times the
//! limit: N times the participants the open-file limit was raised for ([`crate::fdlimit`]),
//! where README's flag table promises that streams beyond the limit are refused. So the cores
//! share the limit. But the kernel hashes each source address:port to one worker, so a flood of
//! random SSRCs from one source lands on one core: with the whole limit pooled it could fill
//! it, and a real caller on another core, which has no silent stream of its own to evict, be
//! refused (README "Stream limit" promises a flood cannot lock out a real caller). So each core
//! is guaranteed a reserve of `max / (2 * cores)` streams (at least 1 when there are as many
//! streams as cores) and the rest is a pool the cores share, an atomic claimed when a core
//! beyond its reserve opens a stream and given back when one ends: no lock, nothing touched
//! for a core's first streams, nothing on the packet path of a stream that exists, and the
//! cores together never hold more than `max`. A core that goes away (a worker that failed or
//! panicked) gives its reserve to the pool, for the cores left, which get its sources. A core
//! made by [`crate::Gateway::new`] has a budget of its own, so the sans-IO core alone stays
//! deterministic.
//!
//! A core's claims are also the one table of who holds each of its SSRCs ([`Claims::own_ssrc`],
//! [`Claims::owner`]), and cores sharing a budget share it: README
//! "Speakers" refuses a known SSRC from another address (`ssrc_conflict`), and the kernel may
//! hash that other address to another worker, whose core alone did not know the SSRC (review
//! u: one SSRC from 16 ports under `--workers 2` was two streams). Touched only when a stream
//! opens or ends, as the pool is; a lock of one of `OWNER_SHARDS`, by the SSRC.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::stream::KeyHasher;

/// Locks the SSRC owners of several cores are spread over ([`Owners`]): a flood of random
/// SSRCs opening and evicting streams on every core seldom waits for another core.
const OWNER_SHARDS: usize = 64;

/// Which source holds each SSRC, over the cores of a budget ([`Claims::own_ssrc`]).
#[derive(Debug)]
struct Owners(Box<[Mutex<HashMap<u32, SocketAddr>>]>);

impl Owners {
    fn new() -> Self {
        Owners((0..OWNER_SHARDS).map(|_| Mutex::default()).collect())
    }

    fn shard(&self, ssrc: u32) -> MutexGuard<'_, HashMap<u32, SocketAddr>> {
        // SSRCs are random (RFC 3550 8.1): their low bits spread them.
        self.0[ssrc as usize % OWNER_SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The bound of the cores it is cloned to: a reserve for each and a pool they share.
#[derive(Debug, Clone)]
pub struct StreamBudget {
    /// Room of the pool taken.
    pooled: Arc<AtomicUsize>,
    /// The pool's room: what the reserves leave of `max`, and the reserves of the cores gone.
    /// It only grows.
    pool: Arc<AtomicUsize>,
    /// Reserves not yet taken by a core ([`Claims::new`]).
    reserves: Arc<AtomicUsize>,
    reserve: usize,
    max: usize,
    /// With more than one core: who holds each SSRC, over all of them.
    owners: Option<Arc<Owners>>,
}

impl StreamBudget {
    /// `max` streams for `cores` cores (taken as 1 if 0).
    pub fn new(max: usize, cores: usize) -> Self {
        let cores = cores.max(1);
        let reserve = if max >= cores {
            (max / (2 * cores)).max(1)
        } else {
            0
        };
        StreamBudget {
            pooled: Arc::default(),
            pool: Arc::new(AtomicUsize::new(max - cores * reserve)),
            reserves: Arc::new(AtomicUsize::new(cores)),
            reserve,
            max,
            owners: (cores > 1).then(|| Arc::new(Owners::new())),
        }
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Streams each core is guaranteed.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Streams the cores hold beyond their reserves: the shared pool's room taken.
    pub fn pooled(&self) -> usize {
        self.pooled.load(Ordering::Relaxed)
    }

    /// Room in the pool for one more stream, taken if there is. A count only (no data passes
    /// through it): relaxed ordering is enough for the bound to hold, as the pool's room only
    /// grows (a stale read of it is smaller, never larger).
    fn try_claim(&self) -> bool {
        let pool = self.pool.load(Ordering::Relaxed);
        self.pooled
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < pool).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        let before = self.pooled.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "released {n} of {before} pooled streams");
    }

    /// A core's reserve, if one is left: a budget cloned to more cores than it was made for
    /// gives the others none, and the bound still holds.
    fn take_reserve(&self) -> usize {
        if self.reserve == 0 {
            return 0;
        }
        let taken = self
            .reserves
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if taken { self.reserve } else { 0 }
    }
}

/// One core's share of a [`StreamBudget`]: the streams it claimed, its reserve's first. What it
/// still holds when dropped goes back, and its reserve goes to the pool (a worker that failed
/// or panicked must not keep its streams' room from the others, which get its sources).
#[derive(Debug)]
pub struct Claims {
    budget: StreamBudget,
    reserve: usize,
    held: usize,
    /// Which source each SSRC of this core's streams belongs to; with several cores each is
    /// in the budget's [`Owners`] too, given back when the core goes away.
    owned: HashMap<u32, SocketAddr, KeyHasher>,
}

impl Claims {
    pub fn new(budget: StreamBudget) -> Self {
        let reserve = budget.take_reserve();
        Claims {
            budget,
            reserve,
            held: 0,
            owned: HashMap::default(),
        }
    }

    /// Takes `ssrc` for a stream from `source` about to open: false when a stream of this core
    /// holds it, or another core's from another source. Given back by [`Claims::disown_ssrc`]
    /// when the stream ends or is not opened after all.
    pub fn own_ssrc(&mut self, ssrc: u32, source: SocketAddr) -> bool {
        if self.owned.contains_key(&ssrc) {
            return false;
        }
        if let Some(owners) = &self.budget.owners {
            let mut shard = owners.shard(ssrc);
            match shard.get(&ssrc) {
                Some(&owner) if owner != source => return false,
                Some(_) => {}
                None => {
                    shard.insert(ssrc, source);
                }
            }
        }
        self.owned.insert(ssrc, source);
        true
    }

    /// The source whose stream on this core holds `ssrc`.
    pub fn owner(&self, ssrc: u32) -> Option<SocketAddr> {
        self.owned.get(&ssrc).copied()
    }

    /// Gives back `ssrc`, if this core holds it for `source`.
    pub fn disown_ssrc(&mut self, ssrc: u32, source: SocketAddr) {
        if self.owned.get(&ssrc) != Some(&source) {
            return;
        }
        self.owned.remove(&ssrc);
        self.disown_ssrc_of(ssrc, source);
    }

    /// [`Claims::disown_ssrc`] of an SSRC already taken out of `owned`.
    fn disown_ssrc_of(&self, ssrc: u32, source: SocketAddr) {
        if let Some(owners) = &self.budget.owners {
            let mut shard = owners.shard(ssrc);
            if shard.get(&ssrc) == Some(&source) {
                shard.remove(&ssrc);
            }
        }
    }

    /// Whether another source than `source` holds `ssrc`, on this core or another.
    pub fn held_by_another(&self, ssrc: u32, source: SocketAddr) -> bool {
        self.owner(ssrc).is_some_and(|owner| owner != source)
            || self.budget.owners.as_ref().is_some_and(|owners| {
                (owners.shard(ssrc).get(&ssrc)).is_some_and(|&owner| owner != source)
            })
    }

    /// Streams this core claimed and has not given back.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Claims room for a stream about to open: from the core's reserve while it lasts, else
    /// from the pool; false when both are full.
    pub fn claim(&mut self) -> bool {
        let ok = self.held < self.reserve || self.budget.try_claim();
        self.held += usize::from(ok);
        ok
    }

    /// Gives back the room of a stream that ended: to the pool while the core holds more than
    /// its reserve.
    pub fn release(&mut self) {
        debug_assert!(self.held > 0, "a stream released twice");
        if self.held > self.reserve {
            self.budget.release(1);
        }
        self.held -= 1;
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.budget.release(self.held.saturating_sub(self.reserve));
        self.budget.pool.fetch_add(self.reserve, Ordering::Relaxed);
        // A core gone (a worker that failed or panicked) holds no SSRC: its sources are hashed
        // to the cores left.
        for (ssrc, source) in std::mem::take(&mut self.owned) {
            self.disown_ssrc_of(ssrc, source);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_sharing_a_budget_take_its_bound_between_them() {
        // A reserve of 1 each and a pool of 2.
        let budget = StreamBudget::new(4, 2);
        assert_eq!(budget.reserve(), 1);
        let (mut a, mut b) = (Claims::new(budget.clone()), Claims::new(budget.clone()));
        assert!(a.claim() && a.claim() && a.claim());
        assert!(!a.claim(), "the pool is shared, not each core's");
        assert_eq!((a.held(), budget.pooled()), (3, 2));
        // `a` cannot take `b`'s reserve.
        assert!(b.claim() && !b.claim());
        // Room beyond a reserve goes back to the pool, for either core.
        a.release();
        assert_eq!(budget.pooled(), 1);
        assert!(b.claim());
        assert!(!a.claim());
        a.release();
        assert_eq!((a.held(), budget.pooled()), (1, 1));
        // A core within its reserve gives back to it: the room stays the core's.
        a.release();
        assert_eq!((a.held(), budget.pooled()), (0, 1));
        assert!(b.claim() && !b.claim());
        assert!(a.claim(), "a core under its reserve always has room");
        // A core that goes away gives back what it held from the pool, and its reserve: the
        // core left has the whole bound.
        drop(b);
        assert_eq!(budget.pooled(), 0);
        assert_eq!((0..4).filter(|_| a.claim()).count(), 3);
        assert_eq!(a.held(), 4);
        drop(a);
        assert_eq!(budget.pooled(), 0);
    }

    #[test]
    fn the_bound_holds_for_any_number_of_cores() {
        for (max, cores) in [
            (0, 1),
            (1, 1),
            (7, 1),
            (1, 2),
            (3, 2),
            (8, 2),
            (100, 3),
            (2, 5),
        ] {
            let budget = StreamBudget::new(max, cores);
            // One core more than the budget is for gets no reserve.
            let mut all: Vec<Claims> = (0..=cores).map(|_| Claims::new(budget.clone())).collect();
            let mut taken = 0;
            for c in &mut all {
                while c.claim() {
                    taken += 1;
                }
            }
            assert_eq!(taken, max, "{max} streams for {cores} cores");
            assert!(budget.reserve() > 0 || max < cores);
            assert!(budget.reserve() * 2 * cores <= max.max(2 * cores));
            drop(all);
            assert_eq!(budget.pooled(), 0);
            // The reserves of the cores gone are the pool's: a core made now has none, and
            // the whole bound.
            let mut c = Claims::new(budget.clone());
            assert_eq!((0..=max).filter(|_| c.claim()).count(), max);
        }
    }

    #[test]
    fn a_core_alone_says_who_holds_each_ssrc() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:5000".parse().unwrap(),
            "10.0.0.2:5000".parse().unwrap(),
        );
        let mut c = Claims::new(StreamBudget::new(8, 1));
        assert!(c.own_ssrc(7, a));
        assert_eq!(c.owner(7), Some(a));
        assert!(!c.own_ssrc(7, b), "another source's stream is refused");
        assert!(c.held_by_another(7, b) && !c.held_by_another(7, a));
        // Only its holder gives it back.
        c.disown_ssrc(7, b);
        assert_eq!(c.owner(7), Some(a));
        c.disown_ssrc(7, a);
        assert_eq!(c.owner(7), None);
        assert!(c.own_ssrc(7, b));
    }

    #[test]
    fn cores_sharing_a_budget_share_who_holds_each_ssrc() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:5000".parse().unwrap(),
            "10.0.0.2:5000".parse().unwrap(),
        );
        let budget = StreamBudget::new(8, 2);
        let (mut x, mut y) = (Claims::new(budget.clone()), Claims::new(budget.clone()));
        assert!(x.own_ssrc(7, a));
        assert!(!y.own_ssrc(7, b), "held on the other core");
        assert!(y.held_by_another(7, b));
        assert_eq!(y.owner(7), None, "not a stream of this core");
        // A core gone gives back what it held.
        drop(x);
        assert!(y.own_ssrc(7, b));
    }

    #[test]
    fn one_core_has_the_whole_bound() {
        let budget = StreamBudget::new(5, 1);
        let mut c = Claims::new(budget);
        assert_eq!((0..10).filter(|_| c.claim()).count(), 5);
    }
}
